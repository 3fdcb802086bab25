"""Stalled runs said live (protocol 1.13): a script run's launcher writes a ``stalled`` event when
its ranks make no step for max(60 s, 10 x the median step) while their processes live, and
again with ``since`` null once a step comes. Here the event is read within bounds and the row
changed: one conditional update per change (the run still running, on the sink's attempt), so
that a late event of an attempt that ended marks nothing, and a stall is announced once.

The sink (sink.py, ``_stalled_store``) turns the event into the page's ``stalled`` message and
the log's line from what ``stalled_change`` returns. A stall that begins sends
``signals.run_stalled``, which notifies the owner where they asked. The attempt's end clears the
row in its own transition (core/transitions.py's ATTEMPT_ENDED).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dashboard.experiments.core.messages import StalledBody
from dashboard.experiments.core.signals import run_stalled
from dashboard.experiments.core.stalls import (
    NO_RESUME,
    STEPS_AGAIN,
    ResumeOffer,
    Stalled,
    StalledRank,
    resume_offer,
    stalled_texts,
)
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.bounds import is_count, number_or_none

# A report is trusted to be small, not to be well-formed: what one event can put on the row.
MAX_STALLED_RANKS = 64  # the launcher's machine's ranks
MAX_STACK_CHARS = 8000  # a rank's stack, from its start: faulthandler writes the current
MAX_COLLECTIVE_CHARS = 200  # thread first, most recent call first
MAX_TEXT_CHARS = 2000


@dataclass(frozen=True)
class StalledSaid:
    """What a readable ``stalled`` event says: the row's new value (None: steps again) and
    the launcher's sentence."""

    stalled: Stalled | None
    text: str


def iso_of(unix: Any) -> str | None:
    """A Unix time as ISO 8601 in UTC; None for anything that is not one."""
    seconds = number_or_none(unix)
    try:
        return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC).isoformat()
    except (OverflowError, OSError, ValueError):  # past what a datetime holds
        return None


def _rank_read(entry: Any) -> StalledRank | None:
    if not isinstance(entry, dict) or not is_count(entry.get("rank")):
        return None
    collective, stack, line = entry.get("collective"), entry.get("stack"), entry.get("line")
    return {
        "rank": entry["rank"],
        "collective": collective[:MAX_COLLECTIVE_CHARS] if isinstance(collective, str) else "",
        "entered": entry.get("entered") is True,
        "stack": stack[:MAX_STACK_CHARS] if isinstance(stack, str) else "",
        "waiting_since": iso_of(entry.get("waiting_since")),
        "line": line[: MAX_COLLECTIVE_CHARS * 4] if isinstance(line, str) else "",
    }


def stalled_read(message: dict[str, Any]) -> StalledSaid | None:
    """The event's fields within bounds; None where ``since`` is neither a Unix time nor null
    (nothing can be said of it). A rank's entry that is not one is left out."""
    since, text = message.get("since", ""), message.get("text")
    text = text[:MAX_TEXT_CHARS] if isinstance(text, str) else ""
    if since is None:
        return StalledSaid(stalled=None, text=text or STEPS_AGAIN)
    iso = iso_of(since)
    if iso is None:
        return None
    ranks = message.get("ranks")
    read = [_rank_read(e) for e in (ranks if isinstance(ranks, list) else [])[:MAX_STALLED_RANKS]]
    entries = [entry for entry in read if entry is not None]
    if not text:  # the launcher's words are the banner's: a stall is never shown wordless
        text = f"No step since {iso}."
    return StalledSaid(stalled={"since": iso, "ranks": entries, "text": text}, text=text)


def stalled_body(
    stalled: Stalled | None, *, text: str, resume: ResumeOffer = NO_RESUME
) -> StalledBody:
    """The page's message: the row's ``stalled`` (None: none) and the log's line, a warning
    while stalled ("": no line); ``resume``: the banner's Stop and resume (a stall's)."""
    return {
        "type": "stalled", "stalled": stalled, "texts": stalled_texts(stalled, resume=resume),
        "text": text, "level": "info" if stalled is None else "warning",
    }  # fmt: skip


def _rows(experiment: Experiment) -> Any:
    """The run's row while the sink's attempt runs: an ended attempt is stalled no more."""
    return Experiment.objects.filter(
        pk=experiment.pk, status=Status.RUNNING, attempt=experiment.attempt
    )


def stalled_change(*, experiment: Experiment, said: StalledSaid) -> StalledBody | None:
    """Record what the event says on the row, and return the page's message; None where it
    changed nothing (the run is not
    running this attempt any more, or the stall was cleared already).

    A stall that begins is announced (``run_stalled``); one said again while the row holds a
    stall (another machine's launcher, say) replaces it, said in the log and on the page."""
    stalled = said.stalled
    if stalled is None:
        if _rows(experiment).filter(stalled__isnull=False).update(stalled=None) != 1:
            return None
        return stalled_body(None, text=said.text)
    if _rows(experiment).filter(stalled__isnull=True).update(stalled=stalled) == 1:
        run_stalled.send(sender=Experiment, experiment_id=experiment.pk, text=said.text)
    elif _rows(experiment).filter(stalled__isnull=False).update(stalled=stalled) != 1:
        return None
    return stalled_body(stalled, text=said.text, resume=resume_offer(experiment=experiment))
