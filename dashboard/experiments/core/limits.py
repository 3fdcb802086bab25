"""Per-user launch limits: runs active at once (queued or running) and launches per minute.

A single launch over the active limit is refused (429). A study's runs are one launch: they are
queued past the active limit (`launch_slot_claim(..., queue_over_active=True)`) and wait in the
queue, where the claim holds each user to TRAINYARD_MAX_ACTIVE_RUNS_PER_USER runs *running*
at once (queue.queue_turn_refusal).

Every launch, a study's too, stays within TRAINYARD_MAX_QUEUED_RUNS_PER_USER runs queued or
running (launch_room_refusal): a study asks for room for all its runs up front and is refused
whole (409) where they do not fit, so no user can queue without bound.

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
LIMIT_QUEUED = "queued_runs"


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


def runs_active(*, owner: Any) -> int:
    """The owner's runs queued or running; a run reported from outside holds no worker and does
    not count against launches."""
    mine = Experiment.objects.filter(owner_id=owner.pk, status__in=ACTIVE_STATUSES)
    return mine.exclude(reported=True).count()


def launch_room_refusal(*, owner: Any, runs: int) -> str | None:
    """Why `runs` more runs would take the owner past TRAINYARD_MAX_QUEUED_RUNS_PER_USER runs
    queued or running, or None (also where 0 turns the bound off)."""
    most = settings.TRAINYARD_MAX_QUEUED_RUNS_PER_USER
    if most <= 0:
        return None
    active = runs_active(owner=owner)
    if active + runs <= most:
        return None
    bound = (
        f"the most one user may have queued or running is {most} "
        f"(TRAINYARD_MAX_QUEUED_RUNS_PER_USER)"
    )
    if runs == 1:
        return f"you have {_runs(active)} queued or running, {bound}"
    if runs > most:
        return f"these {_runs(runs)} can never all be queued: {bound}; launch fewer at once"
    room = max(0, most - active)
    return (
        f"these {_runs(runs)} do not fit: you have {_runs(active)} queued or running, {bound}, "
        f"so there is room for {room} now; launch fewer, or wait for some of yours to end"
    )


def launch_room_check(*, owner: Any) -> LaunchLimited | None:
    refused = launch_room_refusal(owner=owner, runs=1)
    if refused is None:
        return None
    return LaunchLimited(
        f"{refused}; stop one or wait for one to finish, then retry "
        f"(in about {ACTIVE_RETRY_SECONDS} s)",
        limit=LIMIT_QUEUED,
        retry_after=ACTIVE_RETRY_SECONDS,
    )


def launch_active_check(*, owner: Any) -> LaunchLimited | None:
    most = settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER
    if most <= 0:  # 0 turns the limit off
        return None
    active = runs_active(owner=owner)
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
    if not queue_over_active:
        # A study asks for its room itself, for all its runs at once (launch_room_refusal).
        refused = launch_active_check(owner=owner) or launch_room_check(owner=owner)
        if refused is not None:
            return refused
    return launch_rate_check(owner=owner, now=timezone.now())


def launch_slot_claim(*, owner: Any, queue_over_active: bool = False) -> None:
    """Raise LaunchLimited when the owner may not launch now. Call inside transaction.atomic(),
    before the insert: the row lock makes two launches of one user take turns, so that both
    cannot pass the check at once (PostgreSQL; on SQLite select_for_update is a no-op and the
    IMMEDIATE transaction already holds the database's write lock).

    `queue_over_active=True` (a study, called once before inserting all its runs): the runs are
    not refused for the runs the owner already has active; they wait in the queue until the
    owner has fewer than the limit running. The launch rate still applies, and the caller asks
    launch_room_refusal for room for all its runs (under the lock this takes)."""
    list(get_user_model().objects.select_for_update().filter(pk=owner.pk).values_list("pk"))
    refused = launch_limits_check(owner=owner, queue_over_active=queue_over_active)
    if refused is not None:
        raise refused
