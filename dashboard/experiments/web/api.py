"""The JSON API for scripts: /api/experiments/... Same validation as the launch form (the
launch body's types, checks and docs: api_launch.py)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotModified,
    JsonResponse,
    StreamingHttpResponse,
)
from ninja import Router
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from dashboard.api import (
    ApiError,
    errors,
    file_response,
    json_body,
    json_request_body,
    query_params,
)
from dashboard.experiments.core.access import experiment_can_control, experiments_visible_to
from dashboard.experiments.core.checkpoints import (
    checkpoint_file_resolve,
    checkpoint_file_response,
    checkpoint_where_text,
)
from dashboard.experiments.core.descriptions import experiment_is_active
from dashboard.experiments.core.forms import ExperimentForm
from dashboard.experiments.core.labels import experiment_labels_update, labels_check
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.metrics.language import runs_language_read
from dashboard.experiments.metrics.logs import (
    LEVEL_SEVERITY,
    LOG_PAGE_DEFAULT,
    LOG_PAGE_MAX,
    LogFilter,
    log_lines_page,
    log_ranks,
    log_text_lines,
)
from dashboard.experiments.models import ACTIVE_STATUSES, Experiment, Status, Strategy
from dashboard.experiments.selectors import experiment_as_dict
from dashboard.experiments.services import (
    experiment_checkpoint_request,
    experiment_launch,
    experiment_launch_refusals,
    experiment_resume_request,
    experiment_stop,
)
from dashboard.experiments.web.api_launch import (
    MAX_JSON_INT,
    Closed,
    LaunchIn,
    launch_form_data,
    launch_limited_error,
    launch_payload_check,
    launch_script_fields,
)
from dashboard.experiments.web.api_metrics import METRICS_PARAMS, metrics_response
from dashboard.experiments.web.api_schemas import (
    CheckpointsOut,
    ExperimentListOut,
    ExperimentOut,
    LaunchLimitedOut,
    LogsOut,
    MetricsOut,
    ResumeIn,
)
from dashboard.experiments.web.params import body_int, query_int
from dashboard.experiments.web.run_list import (
    LIST_PAGE_MAX,
    SORT_FIELDS,
    ListQueryError,
    list_query_params,
    list_query_parse,
    runs_page,
)
from dashboard.streaming import streamed
from training.registry import STRATEGY_NAMES

MAX_RANK = 999_999  # the logs' rank filter
router = Router(tags=["runs"])
STRING = {"type": "string"}
WHOLE = {"type": "integer", "minimum": 0}
LOG_FORMATS = ("json", "text")


class LabelsIn(Closed):
    # Either may be left out; null is no value for either (labels_check refuses it).
    tags: list[str] | SkipJsonSchema[None] = Field(None, description="replaces the run's tags")
    note: str | SkipJsonSchema[None] = Field(None, description="replaces the run's note")


def _one_of(values: Iterable[str]) -> dict[str, Any]:
    """A list filter's values; empty is no filter (the default sort), as it always was."""
    return {"type": "string", "enum": ["", *values]}


LIST_PARAMS = query_params(
    ("q", STRING, "words in the name, tags or note"),
    ("status", _one_of(Status.values), "one status"),
    ("strategy", _one_of(Strategy.values), "one strategy"),
    # Open sets: torchvision's models, plug-ins and image folders are the workers' to list.
    ("model", STRING, "one model"),
    ("dataset", STRING, "one dataset"),
    ("owner", STRING, "a user name (staff)"),
    ("tag", STRING, "one tag, exactly"),
    (
        "sort",
        _one_of(f"{way}{key}" for key in SORT_FIELDS for way in ("", "-")),
        "created, name, status, accuracy or duration; '-' first to reverse",
    ),
    ("limit", {"type": "integer", "minimum": 1, "maximum": LIST_PAGE_MAX}, "rows a page"),
    ("page", STRING, "the cursor in the last page's `next`"),
)
LOGS_EXTRA = query_params(
    ("rank", {**WHOLE, "maximum": MAX_RANK}, "only this rank's lines"),
    ("level", {"type": "string", "enum": list(LEVEL_SEVERITY)}, "this level or worse"),
    ("after", {**WHOLE, "maximum": MAX_JSON_INT}, "lines after this seq (the last page's last)"),
    ("limit", {**WHOLE, "maximum": LOG_PAGE_MAX}, "lines a page (0 is read as 1)"),
    ("format", {"type": "string", "enum": list(LOG_FORMATS)}, "text: download all as a file"),
) | {
    "responses": {
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
    }
}


def _visible(request: HttpRequest, pk: int) -> Experiment:
    experiment = experiments_visible_to(request.user).filter(pk=pk).first()
    if experiment is None:
        raise ApiError(404, f"no experiment {pk}")
    return experiment


def _controllable(request: HttpRequest, pk: int, doing: str) -> Experiment:
    experiment = _visible(request, pk)
    if not experiment_can_control(experiment=experiment, user=request.user):
        raise ApiError(403, f"only the owner or staff may {doing} this run")
    return experiment


def _query_url(request: HttpRequest, params: dict[str, str]) -> str:
    return request.build_absolute_uri(f"{request.path}?{urlencode(params)}")


def _list_etag(body: dict[str, Any]) -> str:
    """The list's version, left unchanged by what only the clock moves (an active run's
    duration; the page ticks it on), so that an idle list answers 304."""
    rows = [
        {**row, "duration": None} if row["status"] in ACTIVE_STATUSES else row
        for row in body["experiments"]
    ]
    digest = hashlib.sha256(json.dumps({**body, "experiments": rows}).encode()).hexdigest()
    return f'"{digest[:32]}"'


def experiments_list_response(request: HttpRequest) -> HttpResponse:
    """A page of runs: ``count`` over every page, ``next`` (URL or null), and conditional GETs:
    a poll that sends the ETag it has costs a bodiless 304 when nothing changed."""
    try:
        query = list_query_parse(request.GET)
    except ListQueryError as exc:
        raise ApiError(400, str(exc)) from None
    page = runs_page(visible=experiments_visible_to(request.user), query=query)
    params = list_query_params(query)
    # A language model's tokens/s for the whole page in one read (the list reads no series).
    language = runs_language_read(experiments=page.rows)
    body: dict[str, Any] = {
        "count": page.count,
        "next": _query_url(request, {**params, "page": page.next}) if page.next else None,
        "experiments": [
            experiment_as_dict(e, breakdown=False, language=language.get(e.pk)) for e in page.rows
        ],
    }
    etag = _list_etag(body)
    headers = {"ETag": etag, "Cache-Control": "private, no-cache", "Vary": "Cookie, Authorization"}
    if etag in request.headers.get("If-None-Match", ""):
        return HttpResponseNotModified(headers=headers)
    return JsonResponse(body, headers=headers)


@router.get(
    "/experiments/",
    url_name="api-experiments",
    response={200: ExperimentListOut, 304: None, **errors(400)},
    openapi_extra=LIST_PARAMS,
)
def experiments(request: HttpRequest) -> HttpResponse:
    """The caller's runs (staff: everyone's), newest first, a page at a time; send the ETag
    back as If-None-Match for a bodiless 304 when nothing changed."""
    return experiments_list_response(request)


@router.post(
    "/experiments/",
    url_name="api-experiments",
    response={201: ExperimentOut, 429: LaunchLimitedOut, **errors(400, 403, 413)},
    openapi_extra=json_request_body(
        LaunchIn, description="omitted fields take the launch form's defaults"
    ),
)
def experiment_launch_view(request: HttpRequest) -> HttpResponse:
    """Launch a run: the launch form's fields and checks (a refusal names each field); a
    script run's code, entry point and arguments besides (who may: experiments.run_script)."""
    payload = json_body(request)
    errors = launch_payload_check(payload)
    if errors:
        raise ApiError(400, "invalid experiment", errors)
    script = launch_script_fields(user=request.user, payload=payload)
    # Every strategy, the user's own script included (the page's form offers the others).
    form = ExperimentForm(data=launch_form_data(payload), strategies=STRATEGY_NAMES)
    if not form.is_valid():
        errors = {k: [e["message"] for e in v] for k, v in form.errors.get_json_data().items()}
        raise ApiError(400, "invalid experiment", errors)
    fields = {**form.cleaned_data, **script}
    unholdable = experiment_launch_refusals(fields=fields)  # a Slurm run no partition holds
    if unholdable:
        raise ApiError(400, "invalid experiment", unholdable)
    try:
        experiment = experiment_launch(owner=request.user, fields=fields)
    except LaunchLimited as refused:
        raise launch_limited_error(refused) from None
    return JsonResponse(experiment_as_dict(experiment), status=201)


@router.get(
    "/experiments/{pk}/",
    url_name="api-experiment",
    response={200: ExperimentOut, **errors(404)},
)
def experiment_detail(request: HttpRequest, pk: int) -> JsonResponse:
    """The run."""
    return JsonResponse(experiment_as_dict(_visible(request, pk)))


@router.patch(
    "/experiments/{pk}/",
    url_name="api-experiment",
    response={200: ExperimentOut, **errors(400, 403, 404, 413)},
    openapi_extra=json_request_body(LabelsIn, description="either or both"),
)
def experiment_labels(request: HttpRequest, pk: int) -> JsonResponse:
    """Relabel the run (owner or staff): its ``tags`` and/or ``note``."""
    experiment = _controllable(request, pk, "change the tags and note of")
    fields, errors = labels_check(json_body(request))
    if errors:
        raise ApiError(400, "invalid tags or note", errors)
    experiment_labels_update(experiment=experiment, fields=fields)
    return JsonResponse(experiment_as_dict(experiment))


def log_filter_parse(params: Any) -> LogFilter:
    rank = query_int(params, "rank", default=None, lo=0, hi=MAX_RANK)
    level = params.get("level", "").strip().lower()
    if level and level not in LEVEL_SEVERITY:
        raise ApiError(400, f"level must be one of {', '.join(LEVEL_SEVERITY)}")
    return LogFilter(rank=rank, level=level or None)


@router.get(
    "/experiments/{pk}/logs/",
    url_name="api-experiment-logs",
    response={200: LogsOut, **errors(400, 404)},
    openapi_extra=LOGS_EXTRA,
)
def experiment_logs(request: HttpRequest, pk: int) -> HttpResponse:
    """The run's log lines, oldest first, a page at a time (``after=<seq>``, ``limit``), by
    ``rank`` and ``level`` (that level or worse); ``format=text`` downloads them all."""
    experiment = _visible(request, pk)
    where = log_filter_parse(request.GET)
    kind = request.GET.get("format") or "json"
    if kind not in LOG_FORMATS:
        message = f"format must be one of {', '.join(LOG_FORMATS)}"
        raise ApiError(400, message, {"format": [message]})
    # Checked for the text download as well, which reads neither: a bad one is a 400 in both.
    after = query_int(request.GET, "after", default=None, lo=0, hi=MAX_JSON_INT)
    limit = query_int(request.GET, "limit", default=LOG_PAGE_DEFAULT, lo=0, hi=LOG_PAGE_MAX) or 1
    if kind == "text":
        lines = log_text_lines(experiment=experiment, where=where)
        # streamed(): a plain iterator would be read whole into memory under daphne.
        response = StreamingHttpResponse(
            streamed(request, iter(lines)), content_type="text/plain; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="run-{pk}-log.txt"'
        return response
    page = log_lines_page(experiment=experiment, where=where, after=after, limit=limit)
    following = None
    if page.more:
        params = {k: v for k, v in request.GET.items() if k in {"rank", "level", "limit"}}
        following = _query_url(request, {**params, "after": str(page.lines[-1].seq)})
    return JsonResponse(
        {
            "id": pk,
            "lines": [line.as_dict() for line in page.lines],
            "next": following,
            "ranks": log_ranks(experiment=experiment),
        }
    )


@router.get(
    "/experiments/{pk}/metrics/",
    url_name="api-experiment-metrics",
    response={200: MetricsOut, **errors(400, 404)},
    openapi_extra=METRICS_PARAMS,
)
def experiment_metrics(request: HttpRequest, pk: int) -> JsonResponse:
    """The run's series, in buckets by step (``?raw=1``: raw points a page at a time).
    api_metrics.py has the shapes."""
    return metrics_response(request=request, experiment=_visible(request, pk))


@router.post(
    "/experiments/{pk}/stop/",
    url_name="api-experiment-stop",
    response={202: ExperimentOut, **errors(403, 404, 409)},
)
def experiment_stop_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Stop a run (owner or staff). A queued run is cancelled at once, a running one by its
    worker, which ends every process (202 either way)."""
    experiment = _controllable(request, pk, "stop")
    if not experiment_is_active(experiment=experiment):
        raise ApiError(409, f"the run is already {experiment.status}")
    experiment_stop(experiment=experiment, by=request.user)
    experiment.refresh_from_db()
    return JsonResponse(experiment_as_dict(experiment), status=202)


@router.post(
    "/experiments/{pk}/checkpoint/",
    url_name="api-experiment-checkpoint",
    response={202: ExperimentOut, **errors(403, 404, 409)},
)
def experiment_checkpoint_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Ask a running run to write a checkpoint after its current step (202); it is reported by
    a `checkpoint` event and listed with the run's checkpoints."""
    experiment = _controllable(request, pk, "checkpoint")
    return _asked(experiment, experiment_checkpoint_request(experiment=experiment, by=request.user))


@router.post(
    "/experiments/{pk}/resume/",
    url_name="api-experiment-resume",
    response={202: ExperimentOut, **errors(400, 403, 404, 409, 413)},
    openapi_extra=json_request_body(ResumeIn, description="the attempt the page showed stalled"),
)
def experiment_resume_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Stop a stalled run and resume it from its last checkpoint (owner or staff; 202): its
    worker ends every process, then the run is queued again and its next attempt starts from
    the newest checkpoint. The body's ``attempt`` (required) is the attempt the page showed:
    409 where that attempt is over (the run has moved on), the run is not running or not
    stalled, is stopping already, or has no checkpoint the next attempt can read (the answer
    says which)."""
    experiment = _controllable(request, pk, "stop and resume")
    attempt = body_int(json_body(request), "attempt", lo=1, hi=MAX_JSON_INT)
    refused = experiment_resume_request(experiment=experiment, by=request.user, attempt=attempt)
    return _asked(experiment, refused)


def _asked(experiment: Experiment, refused: str | None) -> JsonResponse:
    """A request's answer: 409 with why it cannot be, else the run as it now stands (202)."""
    if refused:
        raise ApiError(409, refused)
    experiment.refresh_from_db()
    return JsonResponse(experiment_as_dict(experiment), status=202)


@router.get(
    "/experiments/{pk}/checkpoints/",
    url_name="api-experiment-checkpoints",
    response={200: CheckpointsOut, **errors(403, 404)},
)
def experiment_checkpoints(request: HttpRequest, pk: int) -> JsonResponse:
    """The run's checkpoints still on disk somewhere, oldest first; ``api_url`` downloads one."""
    experiment = _controllable(request, pk, "list the checkpoints of")
    rows = [c.as_dict() for c in experiment.checkpoints.all()]
    return JsonResponse({"id": pk, "checkpoints": rows})


@router.get(
    "/experiments/{pk}/checkpoints/{step}/",
    url_name="api-experiment-checkpoint-file",
    response=errors(403, 404),
    openapi_extra=file_response("application/octet-stream", "the checkpoint file (torch.save)"),
)
def experiment_checkpoint_file(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    """Download one checkpoint (owner or staff), where this server can read its file."""
    experiment = _controllable(request, pk, "download the checkpoints of")
    checkpoint = experiment.checkpoints.filter(step=step).first()
    if checkpoint is None:
        raise ApiError(404, f"run {pk} has no checkpoint at step {step}")
    path = checkpoint_file_resolve(checkpoint=checkpoint)
    if path is None:
        raise ApiError(404, checkpoint_where_text(checkpoint=checkpoint, experiment=experiment))
    return checkpoint_file_response(checkpoint=checkpoint, path=path)
