"""GET /api/experiments/compare/?ids=1,2,3: the compare page's table as JSON."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Router

from dashboard.api import MAX_ID, ApiError, errors, query_params
from dashboard.experiments.metrics.scaling import BASELINE_RULE, compare_ids_parse, comparison_build
from dashboard.experiments.web.api_schemas import CompareOut

router = Router(tags=["runs"])
IDS = query_params(
    (
        "ids",
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_ID}},
        "the runs: ?ids=1,2,3 or ?ids=1&ids=2",
    ),
    required=("ids",),
)


@router.get(
    "/experiments/compare/",
    url_name="api-experiments-compare",
    response={200: CompareOut, **errors(400)},
    openapi_extra=IDS,
)
def experiments_compare(request: HttpRequest) -> JsonResponse:
    """The compare page's table: throughput, speed-up and efficiency against a baseline; runs
    that are not the caller's (or do not exist) are listed as `missing`."""
    try:
        ids = compare_ids_parse(request.GET.getlist("ids"))
    except ValueError as exc:
        raise ApiError(400, str(exc), {"ids": [str(exc)]}) from None
    if not ids:
        raise ApiError(400, "give the runs to compare: ?ids=1,2,3", {"ids": ["required"]})
    data = comparison_build(user=request.user, ids=ids)
    return JsonResponse(
        {
            "runs": [row.as_dict() for row in data["rows"]],
            "missing": data["missing"],
            "batch_warning": data["batch_warning"],
            "baseline_rule": BASELINE_RULE,
        }
    )
