"""Imports per user per hour (TRAINYARD_IMPORT_RATE_PER_HOUR): every import tried counts,
refused ones too, since each is read and parsed by the web server. An import writes no row
until it is read whole, so each try is a RateEvent, counted as launches count their runs
(limits.py): in one transaction that first locks the owner's row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from dashboard.experiments.core.limits import LaunchLimited
from dashboard.rates import rate_event_record, rate_events_recent, rate_retry_after

LIMIT_IMPORTS = "import_rate"
IMPORT_WINDOW = timedelta(hours=1)


def import_slot_claim(*, owner: Any) -> None:
    """Count one import of `owner` now, or raise LaunchLimited (the API's 429; nothing counted)
    when they have sent TRAINYARD_IMPORT_RATE_PER_HOUR in the last hour. Called before the
    upload is read; the row lock makes two imports of one user take turns, so that both cannot
    pass the check at once."""
    most = settings.TRAINYARD_IMPORT_RATE_PER_HOUR
    if most <= 0:  # 0 turns the limit off
        return
    key = str(owner.pk)
    with transaction.atomic():
        list(get_user_model().objects.select_for_update().filter(pk=owner.pk).values_list("pk"))
        now = timezone.now()
        times = rate_events_recent(kind=LIMIT_IMPORTS, key=key, now=now, window=IMPORT_WINDOW)
        retry_after = rate_retry_after(times=times, most=most, now=now, window=IMPORT_WINDOW)
        if retry_after is not None:
            raise LaunchLimited(
                f"you sent {len(times)} imports in the last hour, the most allowed per user is "
                f"{most} an hour (TRAINYARD_IMPORT_RATE_PER_HOUR); retry in {retry_after} s",
                limit=LIMIT_IMPORTS,
                retry_after=retry_after,
            )
        rate_event_record(kind=LIMIT_IMPORTS, keys=[key], now=now, window=IMPORT_WINDOW)
