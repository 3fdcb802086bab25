"""What the studies' JSON routes take and answer, as typed schemas for /api/schema/.

Documentation of what services.py builds and grid.py checks: the body schema is never checked
by itself (grid.study_request_parse is the one set of rules), and tests/test_schemathesis.py
checks the live answers against the response schemas.
"""

from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from dashboard.studies.args_axes import ARGS_AXIS_PATTERN
from dashboard.studies.grid import AXIS_FIELDS, NAME_MAX
from dashboard.studies.models import BatchMode


class StudyIn(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=NAME_MAX, pattern=r"\S")
    base: dict[str, Any] = Field(
        default_factory=dict,
        description="launch fields every run shares (as POST /api/experiments/)",
    )
    axes: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="launch field -> the values to sweep; one run a cell. A script run's "
        "arguments too: args.<flag> appends --<flag> <value> to the base's args",
        json_schema_extra={
            "propertyNames": {
                "anyOf": [{"enum": list(AXIS_FIELDS)}, {"pattern": ARGS_AXIS_PATTERN}]
            }
        },
    )
    target_accuracy: float = Field(gt=0, le=1, description="the test accuracy to reach")
    stop_at_target: bool = False
    # May be left out (per_process); null is refused.
    batch_mode: SkipJsonSchema[None] | str = Field(
        None, json_schema_extra={"enum": list(BatchMode.values)}
    )


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


class FastestOtherOut(Schema):
    cell: int = Field(description="its index in cells")
    label: str
    time_to_target_seconds: float


class FastestOut(Schema):
    """dashboard/studies/fastest.py's Fastest: the cell with the least time to target."""

    cell: int = Field(description="its index in cells")
    label: str = Field(description='its axes but the seed: "ddp, comm_hook fp16"')
    values: dict[str, Any] = Field(description="its value of each axis but the seed")
    time_to_target_seconds: float = Field(description="the cell's own: the mean over its seeds")
    runs_reached: int
    runs: int
    next: FastestOtherOut | None = Field(description="the next cell to reach the target")
    ratio: float | None = Field(description="next's time / this one's; 1.0 in a tie")
    tied: list[FastestOtherOut] = Field(description="cells at the same time as shown (tenths)")
    reached: int = Field(description="cells with a time to target")
    not_reached: int = Field(description="cells without one whose runs all ended")
    pending: int = Field(description="cells without one that have a run queued or running")
    final: bool = Field(description="every run of the study has ended")


class StudyOut(StudySummaryOut):
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    runs: list[int]
    run_details: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    # Cells not run, each {values, text, reason}: their strategy does not read an option they
    # set (grid.py).
    skipped: list[dict[str, Any]] = []
    scaling: Any
    # Null until a cell has a time to target; the page's sentence in fastest_text either way.
    fastest: FastestOut | None
    fastest_text: str


class StudyStopOut(Schema):
    id: int
    stopping: list[int] = Field(description="the runs asked to stop")
    stopped_at: str
