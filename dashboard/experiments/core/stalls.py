"""A stalled run (protocol 1.13): what the row keeps of the launcher's ``stalled`` event, and the
words the page and the log say of it.

The row's ``stalled`` is the read JSON's as it is: ``since`` (ISO 8601, UTC: when the ranks
last moved), ``ranks`` (each one's ``rank``, ``collective``: the last it entered, ``entered``:
true where it is still in it, its ``stack``, ``waiting_since``, ISO or null, and ``line``, the
launcher's words for it against the latest collective any rank entered) and ``text``, the
launcher's sentence. The page's words for a rank are made here only (the launcher's line, or
these where an older launcher sent none): the run page renders them on the server
(templates/experiments/_stalled.html) and the ``stalled`` messages carry the same ``texts``, so
that static/js/stalled.js only places them. So are the words beside the banner's "Stop and resume
from the last checkpoint" (``resume_offer``: the checkpoint it resumes from, or why it cannot),
which services.py's ``experiment_resume_request`` refuses with.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Final, NotRequired, TypedDict

if TYPE_CHECKING:
    from dashboard.experiments.models import Experiment


class StalledRank(TypedDict):
    rank: int
    collective: str  # "all_reduce #42": the last this rank entered; "" where it made none
    entered: bool  # true: it is still in that collective (has not moved since)
    stack: str  # every thread's Python stack, taken from outside the rank's code
    waiting_since: str | None  # ISO 8601 (UTC), where it is still in it
    line: NotRequired[str]  # the launcher's words for this rank


class Stalled(TypedDict):
    since: str  # ISO 8601 (UTC): when the ranks last moved
    ranks: list[StalledRank]
    text: str  # the launcher's sentence, which the run's log got


class ResumeOffer(TypedDict):
    resumable: bool  # a Stop and resume can be asked (a checkpoint to resume from)
    text: str  # beside the button: what it does, or why it cannot


class StalledTexts(TypedDict):
    since: str  # "stalled since 10:03:04 UTC"
    ranks: list[str]  # each rank's line, in the order of ``Stalled.ranks``
    resume: ResumeOffer  # the banner's Stop and resume ("" and false while it steps)


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


RESUME_NONE: Final = (
    "No checkpoint to resume from: the run saved none before it stalled. Stop ends it; "
    "checkpoints are written at each epoch's end and on request."
)
RESUME_NODES: Final = (
    "A run on several machines is not resumed from here: Stop it, then run it again with its "
    "last checkpoint."
)
RESUME_REPORTED: Final = (
    "A run reported from outside is not resumed from here: its script runs where you started it."
)
NO_RESUME: ResumeOffer = {"resumable": False, "text": ""}


def resume_offer(*, experiment: Experiment) -> ResumeOffer:
    """Whether the run can be stopped and resumed from its last checkpoint, in words: the next
    attempt starts from the newest checkpoint the run reported (runs/attempts.py)."""
    if experiment.reported:
        return {"resumable": False, "text": RESUME_REPORTED}
    if experiment.nodes > 1:
        return {"resumable": False, "text": RESUME_NODES}
    last = experiment.checkpoints.order_by("-step").first()
    if last is None:
        return {"resumable": False, "text": RESUME_NONE}
    return {
        "resumable": True,
        "text": f"ends every process and starts attempt {experiment.attempt + 1} from the last "
        f"checkpoint (step {last.step}).",
    }


def clock_text(iso: str | None) -> str:
    """ "10:03:04 UTC" of a time the row keeps ("" for none, or one it cannot read)."""
    try:
        return datetime.fromisoformat(iso).strftime("%H:%M:%S UTC") if iso else ""
    except ValueError:
        return ""


def stalled_rank_text(entry: StalledRank) -> str:
    """One rank's line: the launcher's, or where it is in its last collective."""
    if entry.get("line"):
        return entry["line"]
    rank, collective = entry["rank"], entry["collective"]
    if not collective:
        return f"rank {rank} made no collective yet"
    if not entry["entered"]:
        return f"rank {rank} is not in a collective (its last: {collective})"
    since = clock_text(entry.get("waiting_since"))
    return f"rank {rank} waits in {collective}" + (f" since {since}" if since else "")


def stalled_rows(stalled: Stalled | None) -> list[StalledRow]:
    """Each rank's line with its stack, as the banner lists them (none while it steps)."""
    ranks = stalled["ranks"] if stalled else []
    return [
        {"rank": entry["rank"], "line": stalled_rank_text(entry), "stack": entry["stack"]}
        for entry in ranks
    ]


def stalled_texts(stalled: Stalled | None, *, resume: ResumeOffer = NO_RESUME) -> StalledTexts:
    """What the page places beside the stored ``stalled``: empty while it steps; ``resume``,
    the run's ``resume_offer`` (a stall's)."""
    since = clock_text(stalled["since"]) if stalled else ""
    return {
        "since": f"stalled since {since}" if since else "",
        "ranks": [row["line"] for row in stalled_rows(stalled)],
        "resume": resume if stalled else NO_RESUME,
    }
