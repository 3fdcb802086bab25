"""Per-user launch limits: runs active at once (queued or running) and launches per minute.

A single launch over the active limit is refused (429). A study's runs are one launch: they are
queued past the active limit (`launch_slot_claim(..., queue_over_active=True)`) and wait in the
queue, where the claim holds each user to TRAINYARD_MAX_ACTIVE_RUNS_PER_USER runs *running*
at once (queue.queue_turn_refusal).

Both are counted from the Experiment rows themselves, so they hold across every web server
process without a cache: the check and the insert run in one transaction that first locks the
owner's row (SQLite's IMMEDIATE transactions serialise writers the same way).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from dashboard.experiments.models import ACTIVE_STATUSES, Experiment
from dashboard.rates import RATE_WINDOW, rate_retry_after

# An active run ends when it ends: there is no exact time to give, so clients poll this often.
ACTIVE_RETRY_SECONDS = 30
LIMIT_ACTIVE = "active_runs"
LIMIT_RATE = "launch_rate"


class LaunchLimited(Exception):
    """A launch refused by a per-user limit: the API answers 429, the form shows the message."""

    def __init__(self, message: str, *, limit: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.retry_after = retry_after

    def as_details(self) -> dict[str, Any]:
        return {"limit": self.limit, "retry_after": self.retry_after}


def _runs(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"


def launch_active_check(*, owner: Any) -> LaunchLimited | None:
    most = settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER
    if most <= 0:  # 0 turns the limit off
        return None
    # A run reported from outside holds no worker: it does not count against launches.
    active = (
        Experiment.objects.filter(owner_id=owner.pk, status__in=ACTIVE_STATUSES)
        .exclude(reported=True)
        .count()
    )
    if active < most:
        return None
    return LaunchLimited(
        f"you have {_runs(active)} queued or running, the most allowed per user is {most} "
        f"(TRAINYARD_MAX_ACTIVE_RUNS_PER_USER); stop one or wait for one to finish, then "
        f"retry (in about {ACTIVE_RETRY_SECONDS} s)",
        limit=LIMIT_ACTIVE,
        retry_after=ACTIVE_RETRY_SECONDS,
    )


def launch_rate_check(*, owner: Any, now: datetime) -> LaunchLimited | None:
    most = settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE
    recent = list(
        Experiment.objects.filter(owner_id=owner.pk, created_at__gt=now - RATE_WINDOW)
        .order_by("created_at")
        .values_list("created_at", flat=True)
    )
    retry_after = rate_retry_after(times=recent, most=most, now=now)
    if retry_after is None:
        return None
    return LaunchLimited(
        f"you launched {_runs(len(recent))} in the last minute, the most allowed per user is "
        f"{most} a minute (TRAINYARD_LAUNCH_RATE_PER_MINUTE); retry in {retry_after} s",
        limit=LIMIT_RATE,
        retry_after=retry_after,
    )


def launch_limits_check(*, owner: Any, queue_over_active: bool = False) -> LaunchLimited | None:
    active = None if queue_over_active else launch_active_check(owner=owner)
    return active or launch_rate_check(owner=owner, now=timezone.now())


def launch_slot_claim(*, owner: Any, queue_over_active: bool = False) -> None:
    """Raise LaunchLimited when the owner may not launch now. Call inside transaction.atomic(),
    before the insert: the row lock makes two launches of one user take turns, so that both
    cannot pass the check at once (PostgreSQL; on SQLite select_for_update is a no-op and the
    IMMEDIATE transaction already holds the database's write lock).

    `queue_over_active=True` (a study, called once before inserting all its runs): the runs are
    not refused for the runs the owner already has active; they wait in the queue until the
    owner has fewer than the limit running. The launch rate still applies."""
    list(get_user_model().objects.select_for_update().filter(pk=owner.pk).values_list("pk"))
    refused = launch_limits_check(owner=owner, queue_over_active=queue_over_active)
    if refused is not None:
        raise refused
