"""Per-user limits of N actions in a sliding window, counted from rows, so that they hold across
every web server process without a cache: the rows the actions wrote themselves (a run's
`created_at`, a token's), or, for an action that leaves none (a failed login, an import tried),
a RateEvent written for it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from dashboard.models import RateEvent

RATE_WINDOW = timedelta(minutes=1)


def rate_retry_after(
    *, times: Sequence[datetime], most: int, now: datetime, window: timedelta = RATE_WINDOW
) -> int | None:
    """Seconds until one more action is allowed, or None when it is allowed now. `times`: the
    actions of the last `window`, oldest first; `most` <= 0 turns the limit off."""
    if most <= 0 or len(times) < most:
        return None
    # Below the limit again once enough of them are older than the window.
    frees_at = times[len(times) - most] + window
    return max(1, math.ceil((frees_at - now).total_seconds()))


def rate_events_recent(*, kind: str, key: str, now: datetime, window: timedelta) -> list[datetime]:
    """When the events of `kind` for `key` in the last `window` happened, oldest first."""
    rows = RateEvent.objects.filter(kind=kind, key=key, at__gt=now - window).order_by("at")
    return list(rows.values_list("at", flat=True))


def rate_event_record(*, kind: str, keys: Sequence[str], now: datetime, window: timedelta) -> None:
    """One event of `kind` for each of `keys`; the kind's events older than `window`, which no
    limit counts any more, go."""
    RateEvent.objects.filter(kind=kind, at__lte=now - window).delete()
    RateEvent.objects.bulk_create(RateEvent(kind=kind, key=key, at=now) for key in keys)
