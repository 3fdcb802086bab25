"""A stalled run (protocol 1.13): what the row keeps of the launcher's ``stalled`` event, and the
words the page and the log say of it.

The row's ``stalled`` is the read JSON's as it is: ``since`` (ISO 8601, UTC: the ranks' last
step), ``ranks`` (each one's ``rank``, ``collective``, ``entered``: true where it waits in that
collective, its ``stack``, and ``waiting_since``, ISO or null) and ``text``, the launcher's
sentence. What each rank's line says is written here only: the run page renders it on the
server (templates/experiments/_stalled.html) and the ``stalled`` messages carry the same
``texts``, so that static/js/stalled.js only places them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, TypedDict


class StalledRank(TypedDict):
    rank: int
    collective: str  # "all_reduce #42": the latest any rank entered; "" where none made one
    entered: bool  # true: it waits in that collective; false: it never entered it
    stack: str  # every thread's Python stack, taken from outside the rank's code
    waiting_since: str | None  # ISO 8601 (UTC), where it waits


class Stalled(TypedDict):
    since: str  # ISO 8601 (UTC): the ranks' last step
    ranks: list[StalledRank]
    text: str  # the launcher's sentence, which the run's log got


class StalledTexts(TypedDict):
    since: str  # "no step since 10:03:04 UTC"
    ranks: list[str]  # each rank's line, in the order of ``Stalled.ranks``


class StalledRow(TypedDict):
    rank: int
    line: str
    stack: str


# A step came again and the launcher said nothing more (its sentence is the line otherwise).
STEPS_AGAIN: Final = "Steps again after a stall."
# A `stalled` event the dashboard cannot read stores nothing but this line.
STALLED_UNREAD: Final = (
    "The launcher said the run stalled, but not in a form this dashboard reads (protocol 1.13: "
    "`since` a Unix time or null): the stall is not shown."
)


def clock_text(iso: str | None) -> str:
    """ "10:03:04 UTC" of a time the row keeps ("" for none, or one it cannot read)."""
    try:
        return datetime.fromisoformat(iso).strftime("%H:%M:%S UTC") if iso else ""
    except ValueError:
        return ""


def stalled_rank_text(entry: StalledRank) -> str:
    """One rank's line: where it is in the collective the stall is about."""
    rank, collective = entry["rank"], entry["collective"]
    if not collective:
        return f"rank {rank} made no collective yet"
    if not entry["entered"]:
        return f"rank {rank} never entered {collective}"
    since = clock_text(entry.get("waiting_since"))
    return f"rank {rank} waits in {collective}" + (f" since {since}" if since else "")


def stalled_rows(stalled: Stalled | None) -> list[StalledRow]:
    """Each rank's line with its stack, as the banner lists them (none while it steps)."""
    ranks = stalled["ranks"] if stalled else []
    return [
        {"rank": entry["rank"], "line": stalled_rank_text(entry), "stack": entry["stack"]}
        for entry in ranks
    ]


def stalled_texts(stalled: Stalled | None) -> StalledTexts:
    """What the page places beside the stored ``stalled``: empty while it steps."""
    since = clock_text(stalled["since"]) if stalled else ""
    return {
        "since": f"no step since {since}" if since else "",
        "ranks": [row["line"] for row in stalled_rows(stalled)],
    }
