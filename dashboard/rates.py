"""Per-user limits of N actions in any minute, counted from the rows the actions wrote (a run's
`created_at`, a token's), so they hold across every web server process without a cache."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

RATE_WINDOW = timedelta(minutes=1)


def rate_retry_after(*, times: Sequence[datetime], most: int, now: datetime) -> int | None:
    """Seconds until one more action is allowed, or None when it is allowed now. `times`: the
    actions of the last minute, oldest first; `most` <= 0 turns the limit off."""
    if most <= 0 or len(times) < most:
        return None
    # Below the limit again once enough of them are older than a minute.
    frees_at = times[len(times) - most] + RATE_WINDOW
    return max(1, math.ceil((frees_at - now).total_seconds()))
