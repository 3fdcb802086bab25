"""Who sees and who controls a run: its owner, and staff. Every read of runs for a user starts
from `experiments_visible_to`, so another user's run is a 404, never a 403 that confirms it."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from dashboard.experiments.models import Experiment


def experiments_visible_to(user: Any) -> QuerySet[Experiment]:
    # The owner and a script run's code are in every row's read JSON: one query for a page.
    queryset = Experiment.objects.select_related("owner", "code")
    if getattr(user, "is_staff", False):
        return queryset
    return queryset.filter(owner_id=user.pk)


def experiment_can_control(*, experiment: Experiment, user: Any) -> bool:
    return bool(getattr(user, "is_staff", False) or experiment.owner_id == user.pk)


def script_allowed(*, user: Any) -> bool:
    """Whether `user` may upload code or launch a script run, which runs arbitrary code as the
    worker's user: staff, and those granted experiments.run_script in the admin."""
    if not getattr(user, "is_active", False):
        return False
    return bool(getattr(user, "is_staff", False) or user.has_perm("experiments.run_script"))
