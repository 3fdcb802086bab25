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

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, NotRequired, TypedDict

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.core.checkpoints import checkpoint_file_resolve

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
# The route's refusals of a request made for an attempt or a stall that is over (a retry, a
# second tab, a page left open): the run is not stopped again.
RESUME_NOT_STALLED: Final = (
    "the run is not stalled (it steps again): only a stalled run is stopped and resumed from here"
)


def resume_moved_on_text(*, asked: int, now: int) -> str:
    return (
        f"the run has moved on: attempt {asked} was asked to stop and resume, and attempt {now} "
        "runs now; reload the page to see it"
    )


@dataclass(frozen=True)
class ResumePlan:
    """What a Stop and resume would do: the banner's words, and the worker the next attempt
    must run on ("": any, the checkpoint's file is in the runs folder every machine shares)."""

    offer: ResumeOffer
    pin: str = ""


def resume_plan(*, experiment: Experiment) -> ResumePlan:
    """Whether the run can be stopped and resumed from its last checkpoint, in words, and where.

    The next attempt starts from the newest checkpoint whose file its worker can read
    (runs/attempts.py checkpoint_latest); a worker that cannot read it starts from step 0 and
    replaces the run's series. So the offer names the newest checkpoint and makes sure the next
    attempt can read it: a file this web server reads is in the shared runs folder (docs/guides/
    several-machines.md, or one machine), which every worker reads at the same path; any other
    is on the worker that wrote it only (``Checkpoint.worker``), and the run is pinned there
    (``Experiment.machines``, as the launch form pins one), or refused where that worker is
    offline, unknown, or not one the run is pinned to."""
    if experiment.reported:
        return ResumePlan({"resumable": False, "text": RESUME_REPORTED})
    if experiment.nodes > 1:
        return ResumePlan({"resumable": False, "text": RESUME_NODES})
    last = experiment.checkpoints.order_by("-step").first()
    if last is None:
        return ResumePlan({"resumable": False, "text": RESUME_NONE})
    what = f"the last checkpoint (step {last.step})"
    start = f"ends every process and starts attempt {experiment.attempt + 1}"
    if checkpoint_file_resolve(checkpoint=last, folder_ok=True) is not None:
        return ResumePlan({"resumable": True, "text": f"{start} from {what}."})
    refused = _resume_pin_refusal(experiment=experiment, worker=last.worker, what=what)
    if refused:
        return ResumePlan({"resumable": False, "text": refused})
    text = f"{start} on {last.worker}, where its file is, from {what}."
    return ResumePlan({"resumable": True, "text": text}, pin=last.worker)


def _resume_pin_refusal(*, experiment: Experiment, worker: str, what: str) -> str:
    """Why the run cannot be pinned to the worker that has its checkpoint's file ("": it can)."""
    shared = "a runs folder (TRAINYARD_RUNS_DIR) shared with the web server"
    if not worker:
        return (
            f"The file of {what} is not in {shared}, and no worker is known to hold it: "
            "a new attempt would start from step 0. Stop ends the run."
        )
    if experiment.machines and worker not in experiment.machines:
        pinned = ", ".join(str(name) for name in experiment.machines)
        return (
            f"The file of {what} is on {worker}, and the run is pinned to {pinned}: a new "
            "attempt there would start from step 0. Stop ends the run."
        )
    if not WorkerMachine.objects.online().filter(hostname=worker).exists():
        return (
            f"The file of {what} is on {worker} only (not in {shared}), and {worker} is "
            "offline: a new attempt elsewhere would start from step 0. Stop ends the run."
        )
    return ""


def resume_offer(*, experiment: Experiment) -> ResumeOffer:
    """The banner's words for the Stop and resume (``resume_plan``'s)."""
    return resume_plan(experiment=experiment).offer


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
