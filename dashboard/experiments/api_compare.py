"""GET /api/experiments/compare/?ids=1,2,3: the compare page's table as JSON."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from dashboard.api import ApiError, api_view
from dashboard.experiments.scaling import BASELINE_RULE, compare_ids_parse, comparison_build


@api_view(("GET",))
def experiments_compare(request: HttpRequest) -> JsonResponse:
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
