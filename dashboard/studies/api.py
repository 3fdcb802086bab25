"""The JSON API for studies: /api/studies/... Thin views over services.py, which return plain
dicts; each cell is checked exactly as POST /api/experiments/ checks one launch."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from dashboard.api import ApiError, errors, file_response, json_body, json_request_body
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.web.api_launch import launch_limited_error
from dashboard.experiments.web.api_schemas import LaunchLimitedOut
from dashboard.studies.api_schemas import (
    StudiesOut,
    StudyIn,
    StudyOut,
    StudyStopOut,
)
from dashboard.studies.grid import StudyRefused, study_request_parse
from dashboard.studies.models import Study
from dashboard.studies.services import (
    studies_list,
    studies_visible_to,
    study_as_dict,
    study_can_control,
    study_cells_csv,
    study_create,
    study_stop,
)

router = Router(tags=["studies"])


def study_refused_error(refused: StudyRefused) -> ApiError:
    details = {} if refused.cell is None else {"cell": refused.cell}
    return ApiError(refused.status, refused.message, refused.errors, details=details)


def _visible(request: HttpRequest, pk: int) -> Study:
    # Someone else's study is as absent as one that does not exist.
    study = studies_visible_to(request.user).filter(pk=pk).first()
    if study is None:
        raise ApiError(404, f"no study {pk}")
    return study


@router.get("/studies/", url_name="api-studies", response={200: StudiesOut, **errors()})
def studies(request: HttpRequest) -> HttpResponse:
    """The caller's studies (staff: everyone's), newest first, with their progress."""
    return JsonResponse({"studies": studies_list(user=request.user)})


@router.post(
    "/studies/",
    url_name="api-studies",
    response={201: StudyOut, 429: LaunchLimitedOut, **errors(400, 403, 409, 413)},
    openapi_extra=json_request_body(StudyIn, description="each cell is checked as a launch"),
)
def study_launch(request: HttpRequest) -> HttpResponse:
    """Start a study: one run per cell of the axes, all queued at once (409 where they would
    take the caller past TRAINYARD_MAX_QUEUED_RUNS_PER_USER runs queued or running)."""
    try:
        study = study_create(owner=request.user, request=study_request_parse(json_body(request)))
    except StudyRefused as refused:
        raise study_refused_error(refused) from None
    except LaunchLimited as refused:
        raise launch_limited_error(refused) from None
    return JsonResponse(study_as_dict(study), status=201)


@router.get("/studies/{pk}/", url_name="api-study", response={200: StudyOut, **errors(404)})
def study_detail(request: HttpRequest, pk: int) -> JsonResponse:
    """The study, its runs and its table (a cell per combination of the axes)."""
    return JsonResponse(study_as_dict(_visible(request, pk)))


@router.post(
    "/studies/{pk}/stop/",
    url_name="api-study-stop",
    response={200: StudyStopOut, **errors(403, 404)},
)
def study_stop_view(request: HttpRequest, pk: int) -> JsonResponse:
    """Stop every run of the study still queued or running (owner or staff)."""
    study = _visible(request, pk)
    if not study_can_control(study=study, user=request.user):
        raise ApiError(403, "only the owner or staff may stop this study")
    return JsonResponse(study_stop(study=study, by=request.user))


@router.get(
    "/studies/{pk}/export/",
    url_name="api-study-export",
    response=errors(404),
    openapi_extra=file_response("text/csv", "the table, one row per cell"),
)
def study_export(request: HttpRequest, pk: int) -> HttpResponse:
    """The table as CSV, one row per cell."""
    study = _visible(request, pk)
    response = HttpResponse(study_cells_csv(study), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="study-{study.pk}-cells.csv"'
    return response
