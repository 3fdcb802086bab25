"""The JSON API for scripts: /api/experiments/... Same validation as the launch form."""

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
from ninja import Router, Schema
from pydantic import ConfigDict, Field, create_model
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
from dashboard.experiments.core.forms import FIELDS, LIMITS, LR_MAX, MAX_GPU_IDS, ExperimentForm
from dashboard.experiments.core.labels import experiment_labels_update, labels_check
from dashboard.experiments.core.limits import LaunchLimited
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
    experiment_stop,
)
from dashboard.experiments.web.api_metrics import METRICS_PARAMS, metrics_response
from dashboard.experiments.web.api_schemas import (
    CheckpointsOut,
    ExperimentListOut,
    ExperimentOut,
    LaunchLimitedOut,
    LogsOut,
    MetricsOut,
)
from dashboard.experiments.web.params import query_int
from dashboard.experiments.web.run_list import (
    LIST_PAGE_MAX,
    SORT_FIELDS,
    ListQueryError,
    list_query_params,
    list_query_parse,
    runs_page,
)
from dashboard.streaming import streamed
from training.registry import (
    COUNT,
    OPTIONS_DECLARED,
    SWITCH,
    StrategyOption,
    option_strategies,
)

# JSON types each field accepts; booleans are never numbers here (but a switch's values).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "model": (str,),
    "dataset": (str,),
    "data_path": (str,),
    "strategy": (str,),
    "processes": (int,),
    "nodes": (int,),
    "machines": (list,),
    "gpus": (list,),
    "epochs": (int,),
    "batch_size": (int,),
    "lr": (int, float),
    "optimizer": (str,),
    "seed": (int,),
    # The strategy options (training/registry.py), typed as their defaults: a switch true or
    # false, a count an integer, a choice its values' type (ZeRO's stage 1, a comm hook "fp16").
    **{option.name: (type(option.default),) for option in OPTIONS_DECLARED},
}
# Fields where null means "the default for the strategy" (an option: not given).
NULLABLE_FIELDS = frozenset(
    {"processes", "nodes", "data_path", *(option.name for option in OPTIONS_DECLARED)}
)
TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    bool: "true or false",
}
# Bounds checked before the form sees a value (see launch_payload_bounds_check).
MAX_JSON_INT = 2**63 - 1
MAX_RANK = 999_999
MAX_STRING_CHARS = 200
MAX_PATH_CHARS = 1000  # data_path: Experiment.data_path's column

router = Router(tags=["runs"])
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS_DECLARED}
STRING = {"type": "string"}
WHOLE = {"type": "integer", "minimum": 0}
LOG_FORMATS = ("json", "text")


def _launch_field(name: str, allowed: tuple[type, ...]) -> tuple[Any, Any]:
    """One launch field as the docs show it: its JSON type, the model's choices and help."""
    kind: Any = {str: str, int: int, float: float, list: list[int], bool: bool}[allowed[-1]]
    if name == "machines":
        kind = list[str]  # worker names
    if name in NULLABLE_FIELDS:
        kind = kind | None
    if name in OPTIONS_BY_NAME:
        return kind, _option_schema_field(OPTIONS_BY_NAME[name])
    try:
        field = Experiment._meta.get_field(name)
    except LookupError:
        return kind, None  # a field the form adds (the docs say only its type)
    extra: dict[str, Any] = {"enum": [value for value, _ in field.choices]} if field.choices else {}
    if extra and name in NULLABLE_FIELDS:
        extra["enum"].append(None)  # the enum sits beside anyOf: null must be one of it too
    if not extra:
        extra = _launch_bounds(name)
    # Every field may be omitted (the form's default), the name included.
    default = field.get_default() if field.has_default() else None
    if name in NULLABLE_FIELDS:
        default = None  # decided by the strategy and the GPUs (data_path: no image folder)
    why = str(field.help_text) or None
    return kind, Field(default, description=why, json_schema_extra=extra or None)


def _option_schema_field(option: StrategyOption) -> Any:
    """A strategy option as the docs show it: the registry's help, the strategies that read
    it, its values (null: not given) or bounds."""
    readers = option_strategies(option)
    where = f"read by {', '.join(readers)}" if readers else "no strategy reads it yet"
    extra: dict[str, Any] = {}
    if option.kind == COUNT:
        extra = {"minimum": option.bounds[0], "maximum": option.bounds[1]}
    elif option.kind != SWITCH:
        extra = {"enum": [*option.values, None]}  # beside anyOf: null is one of them too
    why = f"{option.help} ({where}; default {json.dumps(option.default)}; null: not given)"
    return Field(None, description=why, json_schema_extra=extra or None)


def _launch_bounds(name: str) -> dict[str, Any]:
    """The form's bounds of one field (forms.LIMITS, LR_MAX) and the API's string cap."""
    if name in LIMITS:
        low, high = LIMITS[name]
        return {"minimum": low, "maximum": high}
    if name == "lr":
        return {"exclusiveMinimum": 0, "maximum": LR_MAX}
    if FIELD_TYPES[name] == (str,):  # as launch_payload_bounds_check caps them
        return {"maxLength": MAX_PATH_CHARS if name == "data_path" else MAX_STRING_CHARS}
    return {}


# The launch body for the docs only, derived from FIELD_TYPES (the API's type check) and the
# model; the checks themselves stay in launch_payload_check and the launch form.
class Closed(Schema):
    model_config = ConfigDict(extra="forbid")  # an unknown field is refused


LaunchIn: type[Schema] = create_model(  # type: ignore[call-overload]
    "LaunchIn",
    __base__=Closed,
    **{name: _launch_field(name, allowed) for name, allowed in FIELD_TYPES.items()},
)


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


def launch_payload_check(payload: dict[str, Any]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for key in payload:
        if key not in FIELD_TYPES:
            errors[key] = [f"unknown field; the fields are {', '.join(FIELDS)}"]
    for key, allowed in FIELD_TYPES.items():
        if key not in payload or (key in NULLABLE_FIELDS and payload[key] is None):
            continue
        value = payload[key]
        if isinstance(value, bool) != (allowed == (bool,)) or not isinstance(value, allowed):
            errors[key] = [f"must be {TYPE_NAMES[allowed[-1]]}"]  # (int, float): a number
    gpus = payload.get("gpus")
    if isinstance(gpus, list) and any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
        errors["gpus"] = ["must be a list of integer GPU ids"]
    for key, why in launch_payload_bounds_check(payload).items():
        errors.setdefault(key, why)
    return errors


def launch_payload_bounds_check(payload: dict[str, Any]) -> dict[str, list[str]]:
    """Sizes the form cannot take safely: an integer too big for a float (lr) or a database
    column is an OverflowError there, and a huge string would be echoed back in the error."""
    errors: dict[str, list[str]] = {}
    for key in FIELD_TYPES:
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_JSON_INT:
            errors[key] = [f"out of range (at most {MAX_JSON_INT} in size)"]
        elif isinstance(value, str) and len(value) > (
            most := MAX_PATH_CHARS if key == "data_path" else MAX_STRING_CHARS
        ):
            errors[key] = [f"at most {most} characters, not {len(value)}"]
    gpus = payload.get("gpus")
    if isinstance(gpus, list):
        if len(gpus) > MAX_GPU_IDS:
            errors["gpus"] = [f"at most {MAX_GPU_IDS} GPU ids, not {len(gpus)}"]
        elif any(isinstance(g, int) and not isinstance(g, bool) and g < 0 for g in gpus):
            errors["gpus"] = ["GPU ids are whole numbers from 0"]
    return errors


def launch_form_data(payload: dict[str, Any]) -> dict[str, Any]:
    """Omitted fields take the form's defaults."""
    defaults = {name: Experiment._meta.get_field(name).get_default() for name in FIELDS}
    defaults["processes"] = None  # decided by the strategy and the GPUs
    defaults["nodes"] = None  # one machine, or as many as `machines` names
    return {**defaults, **payload}


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
    body: dict[str, Any] = {
        "count": page.count,
        "next": _query_url(request, {**params, "page": page.next}) if page.next else None,
        "experiments": [experiment_as_dict(e, breakdown=False) for e in page.rows],
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
    """Launch a run: the launch form's fields and checks (a refusal names each field)."""
    payload = json_body(request)
    errors = launch_payload_check(payload)
    if errors:
        raise ApiError(400, "invalid experiment", errors)
    form = ExperimentForm(data=launch_form_data(payload))
    if not form.is_valid():
        errors = {k: [e["message"] for e in v] for k, v in form.errors.get_json_data().items()}
        raise ApiError(400, "invalid experiment", errors)
    try:
        experiment = experiment_launch(owner=request.user, fields=form.cleaned_data)
    except LaunchLimited as refused:
        raise launch_limited_error(refused) from None
    return JsonResponse(experiment_as_dict(experiment), status=201)


def launch_limited_error(refused: LaunchLimited) -> ApiError:
    return ApiError(
        429,
        refused.message,
        details=refused.as_details(),
        headers={"Retry-After": str(refused.retry_after)},
    )


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
    if not experiment.is_active:
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
    refused = experiment_checkpoint_request(experiment=experiment, by=request.user)
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
