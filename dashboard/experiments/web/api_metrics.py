"""GET /api/experiments/<id>/metrics/: a run's series, bucketed (the default) or raw.

Bucketed: `{"id", "budget", "step_range", "global_batch_size", "series": {key: {"count",
"buckets"}}}` with at most `?buckets=N` (1..2000, 1000 by default) buckets a series, over the
whole run or over `?from=<step>&to=<step>` (a zoom: finer buckets of that range). Raw (`?raw=1`):
`{"id", "series": {key: [[step, time, value], ...]}, "next": url or null}`, a page of about
`?limit=` rows (10,000 by default) after `?after=<step>`. `?keys=a,b` picks series in both.
The bucket's fields are series.py's.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, JsonResponse

from dashboard.api import ApiError, query_params
from dashboard.experiments.metrics.series import (
    DEFAULT_BUDGET,
    MAX_BUDGET,
    MAX_STEP,
    RAW_PAGE_ROWS,
    series_buckets,
    series_raw,
)
from dashboard.experiments.models import Experiment
from dashboard.experiments.web.params import query_int

STEP = {"type": "integer", "minimum": 0, "maximum": MAX_STEP}
METRICS_PARAMS = query_params(
    # Any other value (0, false, ...) is the bucketed answer, as no `raw` is.
    ("raw", {"type": "string"}, "1 or true: raw points a page at a time"),
    ("keys", {"type": "string"}, "series keys, comma-separated (default: all)"),
    ("buckets", {"type": "integer", "minimum": 1, "maximum": MAX_BUDGET}, "buckets a series"),
    ("from", STEP, "zoom: the first step"),
    ("to", STEP, "zoom: the last step"),
    ("after", {"type": "integer", "minimum": -1, "maximum": MAX_STEP}, "raw: after this step"),
    ("limit", {"type": "integer", "minimum": 1, "maximum": RAW_PAGE_ROWS * 10}, "raw: rows"),
)


def _keys(request: HttpRequest) -> list[str] | None:
    raw = request.GET.get("keys", "")
    keys = [key.strip() for key in raw.split(",") if key.strip()]
    return keys or None


def _global_batch_size(experiment: Experiment) -> int | None:
    value = (experiment.run_info or {}).get("global_batch_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def metrics_response(*, request: HttpRequest, experiment: Experiment) -> JsonResponse:
    # Every documented parameter is checked in either mode, so that a bad one is a 400 even
    # where this mode does not read it.
    raw_page = _raw_page_params(request)
    if request.GET.get("raw") in {"1", "true"}:
        return _raw_response(request=request, experiment=experiment, page_params=raw_page)
    budget = query_int(request.GET, "buckets", default=DEFAULT_BUDGET, lo=1, hi=MAX_BUDGET)
    lo = query_int(request.GET, "from", default=None, lo=0, hi=MAX_STEP)
    hi = query_int(request.GET, "to", default=None, lo=0, hi=MAX_STEP)
    step_range = None
    if lo is not None or hi is not None:
        step_range = (lo or 0, MAX_STEP if hi is None else hi)
        if step_range[0] > step_range[1]:
            raise ApiError(400, "from must not be above to", {"from": [str(lo)], "to": [str(hi)]})
    series = series_buckets(
        experiment=experiment, keys=_keys(request), budget=budget or DEFAULT_BUDGET,
        step_range=step_range,
    )  # fmt: skip
    body: dict[str, Any] = {
        "id": experiment.pk,
        "budget": budget,
        "step_range": list(step_range) if step_range else None,
        "global_batch_size": _global_batch_size(experiment),
        "series": series,
    }
    return JsonResponse(body)


def _raw_page_params(request: HttpRequest) -> tuple[int | None, int | None]:
    after = query_int(request.GET, "after", default=None, lo=-1, hi=MAX_STEP)
    limit = query_int(request.GET, "limit", default=RAW_PAGE_ROWS, lo=1, hi=RAW_PAGE_ROWS * 10)
    return after, limit


def _raw_response(
    *, request: HttpRequest, experiment: Experiment, page_params: tuple[int | None, int | None]
) -> JsonResponse:
    after, limit = page_params
    page = series_raw(
        experiment=experiment, keys=_keys(request), after_step=after, limit=limit or RAW_PAGE_ROWS
    )
    following = None
    if page.next_after is not None:
        query = {key: value for key, value in request.GET.items() if key != "after"}
        query["after"] = str(page.next_after)
        following = request.build_absolute_uri(f"{request.path}?{urlencode(query)}")
    return JsonResponse({"id": experiment.pk, "series": page.series, "next": following})
