"""Whole numbers a client sends: in the query string (?limit=50) and in a JSON body.

One rule for every route, so that the metrics, logs and queue routes refuse the same things."""

from __future__ import annotations

import re
from typing import Any

from dashboard.api import ApiError

# ASCII digits only: str.isdigit() and int() take other scripts' digits too ("²" passed
# isdigit() and then failed int(), a 500; "٣" and "1_0" were read as 3 and 10). Bounded so that
# int() never meets a number of thousands of digits.
QUERY_INT = re.compile(r"-?[0-9]{1,19}")


def _range_text(name: str, lo: int, hi: int) -> str:
    return f"{name} must be a whole number from {lo} to {hi}"


def query_int(params: Any, name: str, *, default: int | None, lo: int, hi: int) -> int | None:
    """The query parameter `name` as a number in lo..hi, `default` when it is absent or empty;
    anything else is a 400 that names the parameter."""
    raw = params.get(name, "")
    if raw == "":
        return default
    # A minus sign only where negatives are allowed: the logs route took digits alone ("-0").
    negative_ok = lo < 0 or not raw.startswith("-")
    if not (negative_ok and QUERY_INT.fullmatch(raw) and lo <= int(raw) <= hi):
        raise ApiError(400, _range_text(name, lo, hi), {name: [raw]})
    return int(raw)


def body_int(body: dict[str, Any], name: str, *, lo: int, hi: int) -> int:
    """The JSON body's field `name`, an integer in lo..hi (true and 1.0 are no integers here)."""
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        message = _range_text(name, lo, hi)
        raise ApiError(400, message, {name: [message]})
    return value
