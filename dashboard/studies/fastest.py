"""A study's answer to issue 18's question, "which trains fastest to the target?", from its table.

The fastest cell is the one with the least time to target (cells.py: the mean over its seeds,
given only once every seed reached the target). Times the table shows alike (to its tenths of a
second) are a tie, won by the earlier cell in table order and said as a tie. Cells without a time
are counted apart: `not_reached` once all their runs ended, `pending` while one is queued or
running, since such a cell could still win; `final` stays false until every run of the study
ended, so that a reader (or a script) never takes the answer so far for the answer.
"""

from __future__ import annotations

from typing import Any, TypedDict

from dashboard.studies.args_axes import args_axes_read
from dashboard.studies.texts import SECONDS_DECIMALS, fastest_text


class FastestOther(TypedDict):
    """Another cell that reached the target: the runner-up, or one tied with the winner."""

    cell: int
    label: str
    time_to_target_seconds: float


class Fastest(TypedDict):
    cell: int  # its index in the table
    label: str
    values: dict[str, Any]
    time_to_target_seconds: float
    runs_reached: int
    runs: int
    next: FastestOther | None
    ratio: float | None  # next's time / this one's: how many times faster (1.0 in a tie)
    tied: list[FastestOther]
    reached: int
    not_reached: int
    pending: int
    final: bool


def cell_values(*, cell: dict[str, Any], axes: dict[str, list[Any]]) -> dict[str, Any]:
    """The cell's value of each of the study's axes but the seed (a cell pools its seeds), as its
    runs train with it (an args axis's as the script got it); an option its strategy does not
    read (None) says nothing of the cell."""
    config = {**cell["config"], **args_axes_read(args=cell["config"]["args"], axes=axes)}
    return {key: config[key] for key in axes if key != "seed" and config.get(key) is not None}


def cell_label(*, cell: dict[str, Any], values: dict[str, Any]) -> str:
    """ "ddp, comm_hook fp16": the strategy bare, every other axis named; the strategy alone
    where the study has no axis but the seed."""
    parts = [str(v) if key == "strategy" else f"{key} {v}" for key, v in values.items()]
    return ", ".join(parts) or str(cell["strategy"])


def _shown(seconds: float) -> float:
    # The figure the table shows: equal figures are a tie, whatever the digits past them.
    return round(seconds, SECONDS_DECIMALS)


def _ended(cell: dict[str, Any]) -> bool:
    return bool(cell["runs_ended"] == len(cell["runs"]))


def _other(i: int, cells: list[dict[str, Any]], labels: list[str]) -> FastestOther:
    return {
        "cell": i,
        "label": labels[i],
        "time_to_target_seconds": cells[i]["time_to_target_seconds"],
    }


def _all_ended(cells: list[dict[str, Any]]) -> bool:
    return all(_ended(cell) for cell in cells)


def _ratio(seconds: float, *, next_seconds: float | None, tie: bool) -> float | None:
    """How many times faster than the next cell: none without one (or at a zero time, which no
    epoch ends at), 1.0 in a tie (the table shows both times alike)."""
    if next_seconds is None or seconds <= 0:
        return None
    return 1.0 if tie else next_seconds / seconds


def fastest_find(*, cells: list[dict[str, Any]], axes: dict[str, list[Any]]) -> Fastest | None:
    """The fastest cell to the target (see the module docstring), None while no cell has a
    time to target."""
    timed = [i for i, cell in enumerate(cells) if cell["time_to_target_seconds"] is not None]
    if not timed:
        return None
    # A stable sort: of cells shown alike, the earlier in table order wins.
    first, *rest = sorted(timed, key=lambda i: _shown(cells[i]["time_to_target_seconds"]))
    winner = cells[first]
    values = [cell_values(cell=cell, axes=axes) for cell in cells]
    labels = [cell_label(cell=cell, values=v) for cell, v in zip(cells, values, strict=True)]
    seconds = winner["time_to_target_seconds"]
    tied = [i for i in rest if _shown(cells[i]["time_to_target_seconds"]) == _shown(seconds)]
    after = cells[rest[0]]["time_to_target_seconds"] if rest else None
    untimed = [cell for cell in cells if cell["time_to_target_seconds"] is None]
    return {
        "cell": first, "label": labels[first], "values": values[first],
        "time_to_target_seconds": seconds,
        "runs_reached": winner["runs_reached"], "runs": len(winner["runs"]),
        "next": _other(rest[0], cells, labels) if rest else None,
        "ratio": _ratio(seconds, next_seconds=after, tie=bool(tied)),
        "tied": [_other(i, cells, labels) for i in tied],
        "reached": len(timed),
        "not_reached": sum(_ended(cell) for cell in untimed),
        "pending": sum(not _ended(cell) for cell in untimed),
        "final": _all_ended(cells),
    }  # fmt: skip


def fastest_build(
    *, cells: list[dict[str, Any]], axes: dict[str, list[Any]], target: float
) -> dict[str, Any]:
    """The study JSON's `fastest` and `fastest_text` (the sentence above the page's table)."""
    fastest = fastest_find(cells=cells, axes=axes)
    final = _all_ended(cells)
    return {
        "fastest": fastest,
        "fastest_text": fastest_text(fastest=fastest, target=target, final=final),
    }
