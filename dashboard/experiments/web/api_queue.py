"""The queue as JSON: GET /api/queue/ and POST /api/queue/<id>/priority/ (staff).

Everyone's queued runs count for positions, but a user who is not staff sees only their own
entries, and of the others only how many are ahead (`ahead`); a waiting reason that names
another user's run (#12) names it as "another user's run" instead. Cancel is the run's own
stop route (POST /api/experiments/<id>/stop/), given as `stop_url`.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from django.db.models import prefetch_related_objects
from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.utils import timezone
from ninja import Router

from dashboard.api import ApiError, errors, json_body, json_request_body
from dashboard.experiments.core.access import reason_for_viewer
from dashboard.experiments.core.descriptions import experiment_devices_label
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.scheduling.queue import (
    PRIORITY_RANGE,
    queue_ordered,
    running_by_owner,
)
from dashboard.experiments.scheduling.queue_estimate import Estimate, queue_estimates_explained
from dashboard.experiments.selectors import iso_or_none
from dashboard.experiments.services import experiment_priority_change
from dashboard.experiments.web.api_schemas import PriorityIn, PriorityOut, QueueOut
from dashboard.experiments.web.params import body_int
from dashboard.texts import (
    QUEUE_ESTIMATE_METHOD,
    QUEUE_NOT_TRIED,
    QUEUE_ORDER,
    end_confirm,
    queue_start_text,
    queue_summary_text,
    runs_ahead_text,
)

router = Router(tags=["queue"])


def queue_entry(
    run: Experiment,
    *,
    position: int,
    estimate: Estimate,
    now: datetime,
    reason: str,
    owner_running: int = 0,
    owner_position: int = 1,
    viewer_runs: set[int] | None = None,
) -> dict[str, Any]:
    start = estimate.start
    wait = max(0.0, (start - now).total_seconds()) if start else None
    return {
        "id": run.pk,
        "name": run.name,
        "owner": run.owner.get_username(),
        "status": run.status,
        "position": position,
        "ahead": position - 1,
        "ahead_text": runs_ahead_text(position - 1),
        "reason": reason or QUEUE_NOT_TRIED,
        "priority": run.priority,
        # What its turn rests on (QUEUE_ORDER): its owner's runs running now, and its place
        # among its owner's queued runs (priority orders those only).
        "owner_running": owner_running,
        "owner_position": owner_position,
        "strategy": run.strategy,
        "processes": run.processes,
        "nodes": run.nodes,
        "gpus": run.gpus,
        "devices_label": experiment_devices_label(experiment=run),
        "created_at": iso_or_none(run.created_at),
        "estimated_start": iso_or_none(start),
        "estimated_start_seconds": wait,
        "estimated_start_text": queue_start_text(wait),
        # What the estimate rests on (which run's end, expected how): shown beside it.
        "estimated_start_basis": reason_for_viewer(estimate.basis, viewer_runs=viewer_runs),
        "url": run.get_absolute_url(),
        "stop_url": reverse("api-experiment-stop", args=[run.pk]),
        # Cancel asks first where the run has waited long (texts.end_confirm).
        "cancel_confirm": end_confirm(
            name=run.name, launched_at=run.created_at.timestamp(), queued=True
        ),
        "priority_url": reverse("api-queue-priority", args=[run.pk]),
    }


def queue_listing(*, user: Any, now: datetime) -> dict[str, Any]:
    """The queue as `user` may see it: claim order, positions counted over everyone's runs."""
    staff = bool(getattr(user, "is_staff", False))
    running = running_by_owner()
    queued = queue_ordered(running=running)
    prefetch_related_objects(queued, "owner")
    estimates = queue_estimates_explained(queued=queued, now=now)
    places: Counter[int] = Counter()
    owner_position = {}
    for run in queued:
        places[run.owner_id] += 1
        owner_position[run.pk] = places[run.owner_id]
    mine = None if staff else set(
        Experiment.objects.filter(owner_id=user.pk).values_list("pk", flat=True)
    )  # fmt: skip
    entries = [
        queue_entry(
            run,
            position=position,
            estimate=estimates[run.pk],
            now=now,
            reason=reason_for_viewer(run.waiting_reason, viewer_runs=mine),
            owner_running=running[run.owner_id],
            owner_position=owner_position[run.pk],
            viewer_runs=mine,
        )
        for position, run in enumerate(queued, start=1)
        if staff or run.owner_id == user.pk
    ]
    return {
        "queue": entries,
        "total": len(queued),
        "summary": queue_summary_text(total=len(queued), shown=len(entries), everyone=staff),
        "estimate": QUEUE_ESTIMATE_METHOD,
        "order": QUEUE_ORDER,  # how turns are shared between users, in one line
        "can_set_priority": staff,
        "priority_range": list(PRIORITY_RANGE),
        "now": now.isoformat(),
    }


@router.get("/queue/", url_name="api-queue", response={200: QueueOut, **errors()})
def queue_view(request: HttpRequest) -> JsonResponse:
    """The queued runs in the order workers claim them, with positions and estimated starts."""
    return JsonResponse(queue_listing(user=request.user, now=timezone.now()))


@router.post(
    "/queue/{pk}/priority/",
    url_name="api-queue-priority",
    response={200: PriorityOut, **errors(400, 403, 404, 409, 413)},
    openapi_extra=json_request_body(
        PriorityIn, description="higher is claimed first among its owner's runs"
    ),
)
def queue_priority_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Set a queued run's priority (staff only): higher is claimed first among its owner's
    queued runs (users take turns between them: scheduling/fair.py)."""
    if not getattr(request.user, "is_staff", False):
        raise ApiError(403, "only staff may set a run's priority")
    low, high = PRIORITY_RANGE
    priority = body_int(json_body(request), "priority", lo=low, hi=high)
    experiment = Experiment.objects.filter(pk=pk).first()
    if experiment is None:
        raise ApiError(404, f"no experiment {pk}")
    if not experiment_priority_change(experiment_id=pk, priority=priority):
        raise ApiError(
            409, f"the run is {experiment.status}; only a queued run's priority moves it"
        )
    listing = queue_listing(user=request.user, now=timezone.now())
    entry = next((e for e in listing["queue"] if e["id"] == pk), None)
    return JsonResponse(entry or {"id": pk, "priority": priority, "status": Status.QUEUED})
