"""GET /api/experiments/<id>/export/?format=csv|json|tensorboard and POST
/api/experiments/import/: a run's series out as files, and files in as a run.

The work is in exports.py and imports.py; here are the HTTP answers. Exports are sent as they
are read (CSV, JSON) or from a temporary file (the TensorBoard zip), never built in memory.
"""

from __future__ import annotations

from typing import IO

from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from ninja import Router

from dashboard.api import (
    MAX_BODY_BYTES,
    MAX_ID,
    ApiError,
    errors,
    file_response,
    query_params,
    with_upload_handler,
)
from dashboard.experiments.core.access import experiments_visible_to
from dashboard.experiments.core.archives import ImportRefused
from dashboard.experiments.core.import_limits import import_slot_claim
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.metrics.exports import (
    RUN_FIELDS,
    ExportRefused,
    export_csv_chunks,
    export_filename,
    export_json_chunks,
    export_size_check,
    export_tensorboard_zip,
)
from dashboard.experiments.metrics.imports import experiment_import, import_max_bytes
from dashboard.experiments.metrics.scaling import compare_ids_parse
from dashboard.experiments.models import Experiment
from dashboard.experiments.selectors import experiment_as_dict
from dashboard.experiments.web.api_schemas import ExperimentOut, LaunchLimitedOut
from dashboard.experiments.web.upload_cap import UploadCap
from dashboard.streaming import streamed
from dashboard.text_input import texts_fault

EXPORT_FORMATS = ("csv", "json", "tensorboard")

router = Router(tags=["exports"])
EXPORT_EXTRA = query_params(
    ("format", {"type": "string", "enum": list(EXPORT_FORMATS)}, "csv (the default)"),
) | {
    "responses": {
        200: {
            "description": "the run's series as a file",
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer"},
                            "name": {"type": "string"},
                            "model": {"type": "string"},
                            "dataset": {"type": "string"},
                            "data_path": {"type": "string"},
                            "series": {
                                "type": "object",
                                "description": "key -> [[step, time, value]]",
                            },
                        },
                    }
                },
                "application/zip": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    }
}
COMPARE_EXTRA = query_params(
    (
        "ids",
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_ID}},
        "the runs",
    ),
    required=("ids",),
) | file_response("application/zip", "the runs as one TensorBoard log, a folder a run")
IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "name": {"type": "string", "description": "the run's name"},
                        "model": {"type": "string", "description": "what was trained"},
                        "dataset": {"type": "string", "description": "on what data"},
                        "data_path": {"type": "string", "description": "the image folder"},
                    },
                }
            }
        },
    }
}


@router.get(
    "/experiments/{pk}/export/",
    url_name="api-experiment-export",
    response=errors(400, 404, 413),
    openapi_extra=EXPORT_EXTRA,
)
def experiment_export(request: HttpRequest, pk: int) -> HttpResponse:
    """The run's series as a file: CSV (the default), JSON, or a TensorBoard log (zip)."""
    # Visible = the owner's or, for staff, anyone's; another user's run is a 404 as elsewhere.
    experiment = experiments_visible_to(request.user).filter(pk=pk).first()
    if experiment is None:
        raise ApiError(404, f"no experiment {pk}")
    kind = request.GET.get("format", "csv")
    if kind not in EXPORT_FORMATS:
        message = f"format must be one of {', '.join(EXPORT_FORMATS)}"
        raise ApiError(400, message, {"format": [message]})
    _size_check([experiment], tensorboard=kind == "tensorboard")
    if kind == "tensorboard":
        name = export_filename(experiment=experiment, suffix="-tensorboard.zip")
        return _zip_response(export_tensorboard_zip(experiments=[experiment]), name)
    chunks = (export_csv_chunks if kind == "csv" else export_json_chunks)(experiment=experiment)
    content_type = "text/csv; charset=utf-8" if kind == "csv" else "application/json"
    response = StreamingHttpResponse(streamed(request, chunks), content_type=content_type)
    filename = export_filename(experiment=experiment, suffix=f".{kind}")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _size_check(experiments: list[Experiment], *, tensorboard: bool) -> None:
    try:
        export_size_check(experiments=experiments, tensorboard=tensorboard)
    except ExportRefused as refused:
        raise ApiError(413, refused.message) from None


def _zip_response(archive: IO[bytes], filename: str) -> FileResponse:
    return FileResponse(
        archive, as_attachment=True, filename=filename, content_type="application/zip"
    )


@router.get(
    "/experiments/compare/export/",
    url_name="api-experiments-compare-export",
    response=errors(400, 404, 413),
    openapi_extra=COMPARE_EXTRA,
)
def experiments_compare_export(request: HttpRequest) -> HttpResponse:
    """The compared runs as one TensorBoard log (a folder per run, which TensorBoard
    overlays); runs that are not the caller's (or do not exist) are left out, as on the
    compare page."""
    try:
        ids = compare_ids_parse(request.GET.getlist("ids"))
    except ValueError as exc:
        raise ApiError(400, str(exc), {"ids": [str(exc)]}) from None
    runs = list(experiments_visible_to(request.user).filter(pk__in=ids).order_by("pk"))
    if not runs:
        raise ApiError(404, "none of these runs is yours; give them as ?ids=1,2,3")
    _size_check(runs, tensorboard=True)
    name = f"trainyard-compare-{'-'.join(str(run.pk) for run in runs)}-tensorboard.zip"
    return _zip_response(export_tensorboard_zip(experiments=runs), name)


class ImportCap(UploadCap):
    """An import over its limit is refused before it is read (413)."""

    slack = MAX_BODY_BYTES  # the multipart's own bytes around the file: its name, its fields

    def limit_get(self) -> int:
        return import_max_bytes()

    def refusal_text(self) -> str:
        return f"the upload is over the import limit of {self.limit} bytes"


@router.post(
    "/experiments/import/",
    url_name="api-experiments-import",
    response={201: ExperimentOut, 429: LaunchLimitedOut, **errors(400, 403, 413)},
    openapi_extra=IMPORT_BODY,
)
@with_upload_handler(ImportCap)
def experiment_import_view(request: HttpRequest) -> JsonResponse:
    """A run from a file: a TensorBoard event file, a zip or tar.gz of a log folder, or a CSV
    whose first column is step; stored as a finished, imported run of the caller's. At most
    TRAINYARD_IMPORT_RATE_PER_HOUR tries a user an hour, and TRAINYARD_IMPORT_CONCURRENCY files
    read at once (then 429 with Retry-After)."""
    try:
        import_slot_claim(owner=request.user)
    except LaunchLimited as refused:
        raise _limited(refused) from None
    upload = request.FILES.get("file")
    if upload is None:
        raise ApiError(400, "send the file as the multipart field `file`", {"file": ["required"]})
    unstorable = texts_fault({key: request.POST.getlist(key) for key in request.POST})
    if unstorable:
        raise ApiError(400, "a field has text that cannot be stored", unstorable)
    name = request.POST.get("name", "")
    # What was trained, where the file does not say (our own TensorBoard export does).
    fields = {key: request.POST.get(key, "") for key in RUN_FIELDS}
    try:
        experiment = experiment_import(owner=request.user, upload=upload, name=name, fields=fields)
    except ImportRefused as refused:
        raise ApiError(refused.status, refused.message) from None
    except LaunchLimited as refused:  # no turn to read it (core/bounded.py)
        raise _limited(refused) from None
    return JsonResponse(experiment_as_dict(experiment), status=201)


def _limited(refused: LaunchLimited) -> ApiError:
    headers = {"Retry-After": str(refused.retry_after)}
    return ApiError(429, refused.message, details=refused.as_details(), headers=headers)
