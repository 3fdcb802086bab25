"""POST /api/experiments/<id>/profile/ and GET .../profiles/: profiles on request, their traces
listed and downloaded, and the latest one with its summary (what the run page reads).

The work is in services.py (the request), runs/profiles.py (on the worker) and
core/profiles.py (the shapes and the files); here are the HTTP answers.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router, Schema

from dashboard.api import ApiError, errors, file_response, json_body, json_request_body
from dashboard.experiments.core.access import experiment_can_control, experiments_visible_to
from dashboard.experiments.core.profiles import (
    profile_as_dict,
    profile_trace_resolve,
    profile_trace_response,
    profile_trace_rows,
)
from dashboard.experiments.models import Experiment, ProfileState
from dashboard.experiments.services import experiment_profile_request
from dashboard.experiments.web.api_schemas import Open
from training.process.run_requests import PROFILE_MAX_STEPS

router = Router(tags=["profiles"])


class ProfileTraceOut(Open):
    rank: int
    steps: int  # the steps the trace holds
    bytes: int | None
    url: str  # downloads the trace: gzipped Chrome trace JSON (Perfetto, chrome://tracing)
    profile: int
    first_step: int | None


class ProfileOut(Open):
    id: int
    state: str  # requested, recording, ready or failed
    state_text: str
    in_flight: bool
    steps: int
    traces: list[ProfileTraceOut]
    summary: list[dict[str, Any]]


class ProfileLatestOut(Schema):
    profile: ProfileOut | None


class ProfileIn(Schema):
    steps: int  # 1 to PROFILE_MAX_STEPS (200)


STEPS_BODY = json_request_body(
    ProfileIn, description=f"the steps to record on every rank, 1 to {PROFILE_MAX_STEPS}"
)


def _run(request: HttpRequest, pk: int, *, doing: str = "") -> Experiment:
    """The run as this user may see it (else a 404), and control it where `doing` says so."""
    experiment = experiments_visible_to(request.user).filter(pk=pk).first()
    if experiment is None:
        raise ApiError(404, f"no experiment {pk}")
    if doing and not experiment_can_control(experiment=experiment, user=request.user):
        raise ApiError(403, f"only the owner or staff may {doing} this run")
    return experiment


def steps_parse(body: dict[str, Any]) -> int:
    steps = body.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= PROFILE_MAX_STEPS:
        raise ApiError(
            400, "invalid profile request",
            {"steps": [f"an integer from 1 to {PROFILE_MAX_STEPS}, got {json_text(steps)}"]},
        )  # fmt: skip
    return steps


def json_text(value: Any) -> str:
    return "nothing" if value is None else repr(value)[:40]


@router.post(
    "/experiments/{pk}/profile/",
    url_name="api-experiment-profile",
    response={202: ProfileOut, **errors(400, 403, 404, 409)},
    openapi_extra=STEPS_BODY,
)
def experiment_profile_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Record a torch.profiler trace of the run's next `steps` steps on every rank (202, the
    profile as requested); 409 where the run is not running, records one already, or its
    strategy cannot."""
    experiment = _run(request, pk, doing="profile")
    steps = steps_parse(json_body(request))
    profile, refused = experiment_profile_request(
        experiment=experiment, steps=steps, by=request.user
    )
    if profile is None:
        raise ApiError(409, refused)
    return JsonResponse(profile_as_dict(profile=profile), status=202)


@router.get(
    "/experiments/{pk}/profiles/",
    url_name="api-experiment-profiles",
    response={200: list[ProfileTraceOut], **errors(404)},
)
def experiment_profiles(request: HttpRequest, pk: int) -> JsonResponse:
    """Every kept trace of the run's ready profiles, oldest profile first, rank order."""
    experiment = _run(request, pk)
    rows = [
        row
        for profile in experiment.profiles.filter(state=ProfileState.READY)
        for row in profile_trace_rows(profile=profile)
    ]
    return JsonResponse(rows, safe=False)


@router.get(
    "/experiments/{pk}/profiles/latest/",
    url_name="api-experiment-profile-latest",
    response={200: ProfileLatestOut, **errors(404)},
)
def experiment_profile_latest(request: HttpRequest, pk: int) -> JsonResponse:
    """The newest profile whatever its state, with its summary per rank (the run page's)."""
    latest = _run(request, pk).profiles.order_by("-requested_at", "-pk").first()
    return JsonResponse({"profile": profile_as_dict(profile=latest) if latest else None})


@router.get(
    "/experiments/{pk}/profiles/{profile_id}/ranks/{rank}/",
    url_name="api-experiment-profile-trace",
    response=errors(404),
    openapi_extra=file_response("application/gzip", "the rank's Chrome trace, gzipped JSON"),
)
def experiment_profile_trace(
    request: HttpRequest, pk: int, profile_id: int, rank: int
) -> HttpResponse:
    """Download one rank's trace, where this server can read its file."""
    profile = _run(request, pk).profiles.filter(pk=profile_id).first()
    if profile is None:
        raise ApiError(404, f"run {pk} has no profile {profile_id}")
    path = profile_trace_resolve(profile=profile, rank=rank)
    if path is None:
        raise ApiError(
            404, f"profile {profile_id} has no trace of rank {rank} on this web server (it was "
            "dropped, or it is on the worker that ran it: share TRAINYARD_RUNS_DIR)",
        )  # fmt: skip
    return profile_trace_response(profile=profile, rank=rank, path=path)
