"""What the studies' JSON routes take and answer, as typed schemas for /api/schema/.

Documentation of what services.py builds and grid.py checks: the body schema is never checked
by itself (grid.study_request_parse is the one set of rules), and tests/test_schemathesis.py
checks the live answers against the response schemas.
"""

from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field


class StudyIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str
    base: dict[str, Any] = Field(
        default_factory=dict,
        description="launch fields every run shares (as POST /api/experiments/)",
    )
    axes: dict[str, list[Any]] = Field(
        default_factory=dict, description="launch field -> the values to sweep; one run a cell"
    )
    target_accuracy: float = Field(description="the test accuracy to reach, above 0, at most 1")
    stop_at_target: bool = False
    batch_mode: str | None = None


class StudySummaryOut(Schema):
    model_config = ConfigDict(extra="allow")

    id: int
    name: str
    owner: str
    status: str
    progress: dict[str, int]
    target_accuracy: float | None
    stop_at_target: bool
    batch_mode: str
    created_at: str
    stopped_at: str | None
    url: str


class StudiesOut(Schema):
    studies: list[StudySummaryOut]


class StudyOut(StudySummaryOut):
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    runs: list[int]
    run_details: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    scaling: Any


class StudyStopOut(Schema):
    id: int
    stopping: list[int] = Field(description="the runs asked to stop")
    stopped_at: str
