"""Runs reported from outside: what a script elsewhere may post, and what the run page says of
one that fell silent. The rules only; storing is runs/reported.py's.

A script run by hand on another machine (`trainyard.init(url=...)`, trainyard/report.py) posts
its ranks' events in batches to `POST /api/experiments/<id>/events/`: the protocol's events
(training/protocol.py) plus `rank` and `seq`, as its ranks write them under a Trainyard launch
(docs/protocol.md, 1.11). A batch is checked whole before anything is stored: one bad event
refuses it with the reason, so a client learns of a bug at once rather than losing points.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from django.conf import settings

from dashboard.experiments.models import Experiment, SeriesPoint, Status
from dashboard.texts import format_duration

# Bounds of one post: the body is within the API's 64 KiB already (dashboard/api.py); these keep
# what one post can make the server do small whatever its events hold.
MAX_EVENTS_PER_POST = 500
MAX_FIGURES = 256  # figures of one `metrics` event: trainyard's run.log takes no more
MAX_TEXT_CHARS = 20_000  # a log line, an error, a traceback
MAX_PATH_CHARS = 4096
MAX_SEQ = 2**53  # JSON's exact integers
MAX_STEP = 2**31 - 1  # what a series point's step column holds
MAX_KEY_CHARS = SeriesPoint._meta.get_field("key").max_length or 200
LOG_LEVELS = frozenset({"info", "warning", "error"})
# The library says these to a launcher only: taken, counted in the rank's order, never stored.
# A `done` of rank 0 ends the run (runs/reported.py). A type of no one's (a newer library's) is
# taken the same way, as the protocol's readers ignore what they do not know; what only a
# Trainyard launch writes is refused, the engine's own types and the launcher's `stalled` (it
# watches its ranks from outside: protocol 1.13): a script that sent them would be telling the
# dashboard what it is not.
LAUNCHER_ONLY = frozenset({"hello", "listening", "stopping", "done"})
WORKER_ONLY = frozenset({"started", "step", "epoch", "profile", "stalled", "finished"})
MAX_TYPE_CHARS = 40


class ReportRefused(Exception):
    """A batch refused whole: the reason names the event and its field."""


@dataclass(frozen=True)
class ReportedEvent:
    """One event as checked: its rank, its rank's seq, its type and the fields of that type."""

    rank: int
    seq: int
    type: str
    time: float
    fields: dict[str, Any]


def _is_whole(value: Any, *, low: int = 0, high: int = MAX_SEQ) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _text_fault(value: Any, name: str, *, most: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        return f"`{name}` must be a string"
    return f"`{name}` is over {most} characters" if len(value) > most else ""


def _step_fault(event: dict[str, Any]) -> str:
    if _is_whole(event.get("step"), high=MAX_STEP):
        return ""
    return f"`step` must be a whole number from 0 to {MAX_STEP}"


def _metrics_fault(event: dict[str, Any], rank: int) -> str:
    values = event.get("values")
    if _step_fault(event):
        return _step_fault(event)
    if not isinstance(values, dict) or len(values) > MAX_FIGURES:
        return f"`values` must be an object of at most {MAX_FIGURES} figures"
    room = MAX_KEY_CHARS - len(f"rank/{rank}/")  # every figure is kept as rank/<r>/<name> too
    for name, value in values.items():
        if not name or len(name) > room:
            return f"a figure's name must have 1 to {room} characters, not {name[:40]!r}"
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"figure {name[:40]!r} must be a number or null"
    return ""


def _log_fault(event: dict[str, Any], rank: int) -> str:
    if event.get("level", "info") not in LOG_LEVELS:
        return f"`level` must be one of {', '.join(sorted(LOG_LEVELS))}"
    return _text_fault(event.get("message"), "message")


def _checkpoint_fault(event: dict[str, Any], rank: int) -> str:
    return _step_fault(event) or _text_fault(event.get("path"), "path", most=MAX_PATH_CHARS)


def _failed_fault(event: dict[str, Any], rank: int) -> str:
    return _text_fault(event.get("error"), "error") or _text_fault(
        event.get("traceback", ""), "traceback"
    )


def _no_fault(event: dict[str, Any], rank: int) -> str:
    return ""


# What each type a script may report must hold (the protocol's fields; others are ignored).
TYPE_FAULTS: dict[str, Callable[[dict[str, Any], int], str]] = {
    "metrics": _metrics_fault,
    "log": _log_fault,
    "checkpoint": _checkpoint_fault,
    "failed": _failed_fault,
    **{name: _no_fault for name in LAUNCHER_ONLY},
}


def _event_read(event: Any, *, world_size: int) -> ReportedEvent:
    if not isinstance(event, dict):
        raise ReportRefused("must be an object")
    kind, rank, seq = event.get("type"), event.get("rank"), event.get("seq")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE_CHARS or kind in WORKER_ONLY:
        raise ReportRefused(f"`type` must be one of {', '.join(sorted(TYPE_FAULTS))}")
    if not _is_whole(rank, high=world_size - 1):
        raise ReportRefused(f"`rank` must be a whole number below the run's {world_size}")
    if not _is_whole(seq, low=1):
        raise ReportRefused(f"`seq` must be a whole number from 1 to {MAX_SEQ}")
    fault = TYPE_FAULTS.get(kind, _no_fault)(event, rank)
    if fault:
        raise ReportRefused(fault)
    time_ = event.get("time", 0.0)
    if isinstance(time_, bool) or not isinstance(time_, int | float) or not math.isfinite(time_):
        raise ReportRefused("`time` must be a number")
    fields = {k: v for k, v in event.items() if k not in {"v", "minor", "run", "seq", "type"}}
    return ReportedEvent(rank=rank, seq=seq, type=kind, time=float(time_), fields=fields)


def report_events_read(*, body: dict[str, Any], world_size: int) -> list[ReportedEvent]:
    """The events of a posted body, checked; raises ReportRefused naming the first fault. Each
    rank's events must come in its seq order (the client sends them so: runs/reported.py's
    high-water mark relies on it)."""
    events = body.get("events")
    if not isinstance(events, list):
        raise ReportRefused('the body must be {"events": [...]}')
    if len(events) > MAX_EVENTS_PER_POST:
        raise ReportRefused(f"{len(events)} events: at most {MAX_EVENTS_PER_POST} a request")
    read: list[ReportedEvent] = []
    last: dict[int, int] = {}
    for index, event in enumerate(events):
        try:
            taken = _event_read(event, world_size=world_size)
        except ReportRefused as exc:
            raise ReportRefused(f"events[{index}]: {exc}") from None
        if taken.seq <= last.get(taken.rank, 0):
            raise ReportRefused(
                f"events[{index}]: rank {taken.rank}'s events must come in seq order"
            )
        last[taken.rank] = taken.seq
        read.append(taken)
    return read


def reported_silent_seconds(*, experiment: Experiment, now: datetime) -> float | None:
    """How long a running run reported from outside has been silent past the bound
    (TRAINYARD_REPORTED_SILENT_SECONDS), or None: heard from lately, or not such a run."""
    if not experiment.reported or experiment.status != Status.RUNNING:
        return None
    if experiment.last_heard_at is None:
        return None
    silent = (now - experiment.last_heard_at).total_seconds()
    return silent if silent >= settings.TRAINYARD_REPORTED_SILENT_SECONDS else None


def reported_silence_text(*, experiment: Experiment, now: datetime) -> str:
    """The run page's sentence for a run reported from outside that fell silent; "" else."""
    silent = reported_silent_seconds(experiment=experiment, now=now)
    if silent is None:
        return ""
    return (
        f"Not heard from for {format_duration(silent)}. The script may have ended without a "
        "word (killed), or cannot reach this server: it keeps its events and sends them when "
        "it can, or `trainyard sync` sends its spool folder later. A Stop ends the run now."
    )
