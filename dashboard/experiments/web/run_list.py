"""The run list: filters, sorts and keyset pages over the runs a user may see.

A page is ``limit`` rows after a cursor that holds the last row's sort value and id, so a page
costs the same at run 10,000 as at run 1 and runs launched while someone pages (they sort first
when newest first) never shift a later page. Every sort is keyset: nulls (no accuracy yet; no
duration while a run has not finished) sort last in either direction, with the id as tie-break.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from django.db import connection
from django.db.models import BooleanField, DurationField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.expressions import RawSQL

from dashboard.api import MAX_ID
from dashboard.experiments.models import Experiment, Status, Strategy
from dashboard.text_input import text_fault

LIST_PAGE_DEFAULT: Final = 500  # what /api/experiments/ answered before it had pages
LIST_PAGE_MAX: Final = 500

# Sort name -> the column (or annotation) it orders by.
SORT_FIELDS: Final = {
    "created": "created_at",
    "name": "name",
    "status": "status",
    "accuracy": "test_accuracy",
    "duration": "run_duration",
}
SORT_DEFAULT: Final = "-created"


class ListQueryError(ValueError):
    """A filter, sort or cursor the list cannot take; the message says which."""


@dataclass(frozen=True)
class ListQuery:
    q: str = ""
    status: str = ""
    strategy: str = ""
    model: str = ""
    dataset: str = ""
    owner: str = ""
    tag: str = ""
    sort: str = SORT_DEFAULT
    after: tuple[Any, int] | None = None  # (sort value, id) of the last row of the page before
    limit: int = LIST_PAGE_DEFAULT

    @property
    def field(self) -> str:
        return SORT_FIELDS[self.sort.lstrip("-")]

    @property
    def descending(self) -> bool:
        return self.sort.startswith("-")


@dataclass(frozen=True)
class ListPage:
    rows: list[Experiment]
    count: int  # rows matching the filters, over every page
    next: str | None  # the cursor of the page after this one


def _choice(params: Any, name: str, choices: list[str]) -> str:
    value = str(params.get(name, "")).strip()
    if value and value not in choices:
        raise ListQueryError(f"{name} must be one of {', '.join(choices)}")
    return value


def list_query_parse(params: Any) -> ListQuery:
    """A ListQuery from a request's GET parameters; ListQueryError names what is wrong."""
    sort = str(params.get("sort") or SORT_DEFAULT)
    if sort.lstrip("-") not in SORT_FIELDS or sort.count("-") > 1:
        raise ListQueryError(f"sort must be one of {', '.join(SORT_FIELDS)}, '-' first to reverse")
    try:
        limit = int(params.get("limit") or LIST_PAGE_DEFAULT)
    except ValueError:
        raise ListQueryError("limit must be a whole number") from None
    if not 1 <= limit <= LIST_PAGE_MAX:
        raise ListQueryError(f"limit must be 1 to {LIST_PAGE_MAX}")
    query = ListQuery(
        q=str(params.get("q", "")).strip()[:200],
        status=_choice(params, "status", list(Status.values)),
        strategy=_choice(params, "strategy", list(Strategy.values)),
        # Any name a worker reports: no list to check against, an unknown one matches nothing.
        model=str(params.get("model", "")).strip()[:200],
        dataset=str(params.get("dataset", "")).strip()[:100],
        owner=str(params.get("owner", "")).strip()[:150],
        tag=str(params.get("tag", "")).strip()[:40],
        sort=sort,
        limit=limit,
    )
    page = params.get("page")
    return replace(query, after=cursor_read(str(page), sort=sort)) if page else query


def cursor_write(query: ListQuery, last: Experiment) -> str:
    value = getattr(last, query.field)
    if isinstance(value, datetime):
        value = value.isoformat()
    elif isinstance(value, timedelta):
        value = value.total_seconds()
    raw = json.dumps({"s": query.sort, "v": value, "i": last.pk}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def cursor_read(cursor: str, *, sort: str) -> tuple[Any, int]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        value, pk, cursor_sort = raw["v"], int(raw["i"]), raw["s"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ListQueryError("page is not a cursor this list gave") from None
    if cursor_sort != sort:
        raise ListQueryError("page belongs to another sort: start again from the first page")
    field = SORT_FIELDS[sort.lstrip("-")]
    if not _cursor_value_fits(field, value) or not 0 < pk <= MAX_ID:
        # A forged cursor must not reach the query: a NUL, or a string compared with a number
        # column, is an error of PostgreSQL's (a 500), not of the list's.
        raise ListQueryError("page is not a cursor this list gave")
    try:
        if value is not None and field == "created_at":
            value = datetime.fromisoformat(value)
        elif value is not None and field == "run_duration":
            value = timedelta(seconds=float(value))
    except (TypeError, ValueError):
        raise ListQueryError("page is not a cursor this list gave") from None
    return value, pk


def _cursor_value_fits(field: str, value: Any) -> bool:
    """What cursor_write writes for the field: a string (name, status, an ISO time), a number
    (accuracy, a duration's seconds), or null."""
    if value is None:
        return True
    if field in {"name", "status", "created_at"}:
        return isinstance(value, str) and not text_fault(value)
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return numeric and math.isfinite(value) and abs(value) < MAX_ID


def _tag_filter(tag: str) -> Q:
    """Runs labelled exactly `tag` (case and all), the same on every database."""
    if connection.features.supports_json_field_contains:
        return Q(tags__contains=[tag])
    # SQLite has no JSON containment, and a LIKE on the list's text ignores case (a filter by
    # "Baseline" found "baseline" there, not on PostgreSQL): compare each element of the list,
    # as json_each gives it, with `=`, which is exact.
    column = f'"{Experiment._meta.db_table}"."tags"'
    sql = f"EXISTS (SELECT 1 FROM json_each({column}) WHERE type = 'text' AND value = %s)"
    return Q(RawSQL(sql, [tag], output_field=BooleanField()))


def runs_filtered(*, visible: QuerySet[Experiment], query: ListQuery) -> QuerySet[Experiment]:
    runs = visible
    if query.q:
        runs = runs.filter(name__icontains=query.q)
    for name in ("status", "strategy", "model", "dataset"):
        if getattr(query, name):
            runs = runs.filter(**{name: getattr(query, name)})
    if query.owner:
        runs = runs.filter(owner__username=query.owner)  # only narrows what `visible` allows
    if query.tag:
        runs = runs.filter(_tag_filter(query.tag))
    return runs


def _keyset(query: ListQuery) -> Q:
    assert query.after is not None
    value, pk = query.after
    field, op = query.field, "lt" if query.descending else "gt"
    if value is None:  # inside the nulls, which come last
        return Q(**{f"{field}__isnull": True, f"id__{op}": pk})
    return (
        Q(**{f"{field}__{op}": value})
        | Q(**{field: value, f"id__{op}": pk})
        | Q(**{f"{field}__isnull": True})
    )


def runs_page(*, visible: QuerySet[Experiment], query: ListQuery) -> ListPage:
    runs = runs_filtered(visible=visible, query=query)
    count = runs.count()
    if query.field == "run_duration":
        # Only a finished run has a duration that stays put; the others sort last.
        runs = runs.annotate(
            run_duration=ExpressionWrapper(
                F("finished_at") - F("started_at"), output_field=DurationField()
            )
        )
    column = F(query.field)
    if query.descending:
        runs = runs.order_by(column.desc(nulls_last=True), "-id")
    else:
        runs = runs.order_by(column.asc(nulls_last=True), "id")
    if query.after is not None:
        runs = runs.filter(_keyset(query))
    rows = list(runs.select_related("owner", "cancelled_by")[: query.limit + 1])
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    return ListPage(rows=rows, count=count, next=cursor_write(query, rows[-1]) if more else None)


def list_query_params(query: ListQuery) -> dict[str, str]:
    """The GET parameters that ask for ``query`` (empty ones left out)."""
    params = {
        "q": query.q,
        "status": query.status,
        "strategy": query.strategy,
        "model": query.model,
        "dataset": query.dataset,
        "owner": query.owner,
        "tag": query.tag,
        "sort": "" if query.sort == SORT_DEFAULT else query.sort,
        "limit": "" if query.limit == LIST_PAGE_DEFAULT else str(query.limit),
    }
    return {name: value for name, value in params.items() if value}
