"""Reading a training event's fields within bounds.

A report is trusted to be small, not to be well-formed: every field is read as whatever JSON it
may be, and what does not fit (a string for a number, a bool for a step) is left out rather
than refused.
"""

from __future__ import annotations

import math
from typing import Any


def number_or_none(value: Any) -> float | None:
    """A finite JSON number as a float; anything else (a bool, a string, NaN) as None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)  # an integer of 400 digits is JSON too: past a float's range
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def is_count(value: Any) -> bool:
    """A whole number from 0 up (a step, an epoch, a rank); a bool is none."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
