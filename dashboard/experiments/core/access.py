"""Who sees and who controls a run: its owner, and staff. Every read of runs for a user starts
from `experiments_visible_to`, so another user's run is a 404, never a 403 that confirms it."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet

from dashboard.experiments.models import Experiment
from dashboard.texts import QUEUE_OTHERS_RUN

RUN_REFERENCE = re.compile(r"#(\d+)")


def experiments_visible_to(user: Any) -> QuerySet[Experiment]:
    # The owner and a script run's code are in every row's read JSON: one query for a page.
    queryset = Experiment.objects.select_related("owner", "code")
    if getattr(user, "is_staff", False):
        return queryset
    return queryset.filter(owner_id=user.pk)


def reason_for_viewer(reason: str, *, viewer_runs: set[int] | None) -> str:
    """The waiting reason with other users' run numbers taken out (viewer_runs None: staff)."""
    if viewer_runs is None:
        return reason

    def name(match: re.Match[str]) -> str:
        return match.group(0) if int(match.group(1)) in viewer_runs else QUEUE_OTHERS_RUN

    return RUN_REFERENCE.sub(name, reason)


def reason_for_owner(*, experiment: Experiment, reason: str) -> str:
    """A reason of the run as its own page and read JSON say it: the owner's runs by number,
    other users' as "another user's run". The stored reason keeps the numbers for the queue
    page, which staff read whole; a run's page is read by its owner (and staff, who see it as
    the owner does). A query only where the reason names a run."""
    named = {int(number) for number in RUN_REFERENCE.findall(reason)}
    if not named:
        return reason
    own = Experiment.objects.filter(owner_id=experiment.owner_id, pk__in=named)
    return reason_for_viewer(reason, viewer_runs=set(own.values_list("pk", flat=True)))


def experiment_can_control(*, experiment: Experiment, user: Any) -> bool:
    return bool(getattr(user, "is_staff", False) or experiment.owner_id == user.pk)


def script_allowed(*, user: Any) -> bool:
    """Whether `user` may upload code or launch a script run, which runs arbitrary code as the
    worker's user: staff, and those granted experiments.run_script in the admin."""
    if not getattr(user, "is_active", False):
        return False
    return bool(getattr(user, "is_staff", False) or user.has_perm("experiments.run_script"))
