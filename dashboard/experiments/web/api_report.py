"""Runs reported from outside, over the JSON API: a script run elsewhere (trainyard.init with a
server: trainyard/report.py) creates its run, then posts its ranks' events in batches. The rules
are core/reported.py's, the storing runs/reported.py's; here are the HTTP answers.

- `POST /api/experiments/report/` `{"key", "name", "processes"}`: the caller's run of that key,
  created running (201) or found (200): every rank asks, and a later `trainyard sync` too.
- `POST /api/experiments/<id>/events/` `{"events": [...]}`: 200 `{"stored", "duplicates",
  "stop", "checkpoint"}`. Only the run's owner may post: anyone else's run is a 404, as the API
  answers for runs one cannot see (staff too: only the script's owner speaks for it).
"""

from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router, Schema
from pydantic import Field

from dashboard.api import ApiError, errors, json_body, json_request_body
from dashboard.experiments.core.reported import (
    MAX_EVENTS_PER_POST,
    ReportRefused,
    report_events_read,
)
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.reported import reported_events_store, reported_run_create
from dashboard.experiments.selectors import experiment_as_dict
from dashboard.experiments.web.api_launch import Closed
from dashboard.experiments.web.api_schemas import ExperimentOut

router = Router(tags=["reported runs"])

KEY = re.compile(r"[A-Za-z0-9_-]{8,64}")
MAX_NAME_CHARS = 200
MAX_PROCESSES = 1024


class ReportIn(Closed):
    key: str = Field(description="the script's own name for the run, 8 to 64 of A-Z a-z 0-9 _ -")
    name: str = Field("script run", description="the run's name")
    processes: int = Field(1, description="its ranks (WORLD_SIZE)", ge=1, le=MAX_PROCESSES)


class EventsIn(Closed):
    events: list[dict[str, Any]] = Field(
        description=f"at most {MAX_EVENTS_PER_POST}: protocol events plus `rank` and `seq`, "
        "each rank's in seq order (docs/protocol.md)"
    )


class EventsOut(Schema):
    stored: int
    duplicates: int
    stop: bool
    checkpoint: int


def _report_fields(body: dict[str, Any]) -> tuple[str, str, int]:
    """The body's key, name and processes, checked (400 names the field)."""
    unknown = sorted(set(body) - {"key", "name", "processes"})
    if unknown:
        raise ApiError(400, f"unknown fields: {', '.join(u[:40] for u in unknown[:5])}")
    key, name, processes = body.get("key"), body.get("name", "script run"), body.get("processes", 1)
    if not isinstance(key, str) or not KEY.fullmatch(key):
        raise ApiError(400, "invalid run", {"key": ["8 to 64 of A-Z a-z 0-9 _ -"]})
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_CHARS:
        raise ApiError(400, "invalid run", {"name": [f"1 to {MAX_NAME_CHARS} characters"]})
    if isinstance(processes, bool) or not isinstance(processes, int):
        raise ApiError(400, "invalid run", {"processes": ["a whole number"]})
    if not 1 <= processes <= MAX_PROCESSES:
        raise ApiError(400, "invalid run", {"processes": [f"from 1 to {MAX_PROCESSES}"]})
    return key, name.strip(), processes


@router.post(
    "/experiments/report/",
    url_name="api-experiments-report",
    response={200: ExperimentOut, 201: ExperimentOut, **errors(400, 403, 413)},
    openapi_extra=json_request_body(ReportIn, description="the same key is the same run"),
)
def experiment_report_view(request: HttpRequest) -> JsonResponse:
    """Create (201) or find (200) the caller's run reported from outside under this key."""
    key, name, processes = _report_fields(json_body(request))
    experiment, created = reported_run_create(
        owner=request.user, key=key, name=name, processes=processes
    )
    return JsonResponse(experiment_as_dict(experiment), status=201 if created else 200)


@router.post(
    "/experiments/{pk}/events/",
    url_name="api-experiment-events",
    response={200: EventsOut, **errors(400, 403, 404, 409, 413)},
    openapi_extra=json_request_body(EventsIn, description="an empty list asks for requests"),
)
def experiment_events_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Store a batch of a reported run's events, each once whatever the retries; the answer
    says what was new and what the script is asked (a Stop, a checkpoint)."""
    experiment = Experiment.objects.filter(pk=pk, owner_id=request.user.pk).first()
    if experiment is None:
        raise ApiError(404, f"no experiment {pk}")
    if not experiment.reported:
        raise ApiError(409, f"run {pk} is not reported from outside: its worker reports it")
    body = json_body(request)
    try:
        events = report_events_read(body=body, world_size=experiment.processes)
    except ReportRefused as refused:
        raise ApiError(400, str(refused)) from None
    answer = reported_events_store(experiment=experiment, events=events)
    return JsonResponse(answer.as_dict())
