"""The stall watch (issue 33 item 3): a run whose ranks make no step for
max(TRAINYARD_STALL_SECONDS, 60 by default; 10 x the median step time) while their processes
live is stalled. A script run's launcher runs it (training/scripts/launch.py), an engine run's
rank 0 in a thread (rank_watch.py). The watch reads every rank's progress record on this
machine (progress.py) once a second; when the ranks stall it takes each rank's Python stack
(STACK_SIGNAL: faulthandler in the rank writes it) and says, per rank, the last collective it
entered and whether it is still in it, against the latest any rank entered: "rank 1 never
entered all_reduce #1842; rank 0 waits in it since 12:03:04 UTC". A move after that (a step, a
forward, a collective entered) ends the stall.

Judged from the first step on (before it there is no step time to go by, and loading may take
long), and only while every rank's record is watched (a script's rank whose observer left, or a
rank that ended, counts no steps).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from training.observe.progress import STACK_FILE, STACK_SIGNAL, RankProgress, progress_read
from training.protocol import StalledFields, StalledRank

FLOOR_SECONDS = 60.0
STEP_TIMES = 10  # x the median step time
CHECK_SECONDS = 1.0
SCRIPT_UNWATCHED = "a rank's script ended or its observer left"
STACK_WAIT_SECONDS = 3.0


class StallWatch:
    def __init__(
        self, folder: Path, *, floor: float = FLOOR_SECONDS, unwatched: str = SCRIPT_UNWATCHED
    ):
        self.folder, self.floor = folder, floor
        self.unwatched = unwatched  # why a rank's record is no longer judged, in the over's text
        self.checked = 0.0
        self.awake = 0.0  # when the watch came back from a pause of its own (paused)
        self.since: float | None = None  # the stall's: the ranks' last move
        self.per_step: deque[float] = deque(maxlen=64)  # seconds a step took, as seen here
        self.seen: tuple[int, float] | None = None  # (the furthest rank's step, when seen)

    def check(self, now: float) -> StalledFields | None:
        """A ``stalled`` event's fields where a stall begins or ends, else None (``now``: Unix
        time; the records' times are too)."""
        if now - self.checked < CHECK_SECONDS:
            return None
        self.checked = now
        ranks = progress_read(self.folder)
        judged = bool(ranks) and all(r.watched for r in ranks)
        if self.since is not None:
            if not judged:
                return self.over(now, why=self.unwatched)
            if max(r.active_at for r in ranks) > self.since:
                return self.over(now, why="steps again")
            return None
        if not judged or not any(r.stepped_at for r in ranks):
            return None
        self.steps_note(ranks, now)
        moved = max(self.awake, *(r.active_at for r in ranks))
        if now - moved < self.bound():
            return None
        self.since = moved
        return stall_fields(ranks, now=now, stacks=stacks_take(self.folder, ranks))

    def paused(self, now: float) -> None:
        """The watch itself did not run for a while (its process was stopped, as a suspended
        run's every process is): the ranks' silence until now is not theirs to be judged by."""
        self.awake, self.seen = now, None

    def steps_note(self, ranks: list[RankProgress], now: float) -> None:
        step = max(r.step for r in ranks)
        if self.seen is not None and step > self.seen[0]:
            self.per_step.append((now - self.seen[1]) / (step - self.seen[0]))
        if self.seen is None or step != self.seen[0]:
            self.seen = (step, now)

    def bound(self) -> float:
        median = statistics.median(self.per_step) if self.per_step else 0.0
        return max(self.floor, STEP_TIMES * median)

    def over(self, now: float, *, why: str) -> StalledFields:
        assert self.since is not None
        text = f"The stall is over after {now - self.since:.0f} s: {why}."
        self.since, self.seen = None, None  # the pause is no step's time
        return {"since": None, "ranks": [], "text": text}


def stall_floor(env: Mapping[str, str]) -> float:
    """TRAINYARD_STALL_SECONDS, the watch's floor (60 s; a test's few seconds)."""
    value = env.get("TRAINYARD_STALL_SECONDS", "")
    try:
        return max(0.5, float(value)) if value else FLOOR_SECONDS
    except ValueError:
        return FLOOR_SECONDS


def stacks_take(folder: Path, ranks: list[RankProgress]) -> dict[int, str]:
    """Every rank's stack, dumped by its faulthandler on STACK_SIGNAL into its stack file (its
    appends land at the start of the emptied file)."""
    asked: dict[int, Path | None] = {}
    for r in ranks:
        path = folder / STACK_FILE.format(rank=r.rank)
        try:
            path.write_text("")
            os.kill(r.pid, STACK_SIGNAL)
            asked[r.rank] = path
        except OSError as error:  # the rank ended, or its folder is gone
            asked[r.rank] = None if isinstance(error, ProcessLookupError) else path
    deadline = time.monotonic() + STACK_WAIT_SECONDS
    while time.monotonic() < deadline and not all(_dumped(p) for p in asked.values() if p):
        time.sleep(0.05)
    time.sleep(0.1)  # the last lines of a dump still being written
    return {
        rank: (path.read_text(errors="replace") if path and path.is_file() else "")
        or "(no stack: the process did not answer)"
        for rank, path in asked.items()
    }


def _dumped(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def stall_fields(ranks: list[RankProgress], *, now: float, stacks: dict[int, str]) -> StalledFields:
    """Each rank's own last collective and whether it is still in it, its line and stack; the
    sentence about the latest collective any rank entered."""
    latest, latest_name = max(r.collectives for r in ranks), _latest_name(ranks)
    entries: list[StalledRank] = []
    for r in ranks:
        entries.append({
            "rank": r.rank, "collective": _own(r), "entered": r.inside,
            "stack": stacks.get(r.rank, ""), "waiting_since": r.entered_at if r.inside else None,
            "line": rank_line(r, latest=latest, latest_name=latest_name),
        })  # fmt: skip
    stepped = max(r.stepped_at for r in ranks)
    return {
        "since": max(r.active_at for r in ranks),
        "ranks": entries,
        "text": f"No step for {now - stepped:.0f} s: {stall_sentence(ranks)}.",
    }


def _own(r: RankProgress) -> str:
    return f"{r.op} #{r.collectives}" if r.collectives else ""


def _latest_name(ranks: list[RankProgress]) -> str:
    latest = max(r.collectives for r in ranks)
    return next((_own(r) for r in ranks if r.collectives == latest), "")


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(when))


def rank_line(r: RankProgress, *, latest: int, latest_name: str) -> str:
    """Where one rank is against the latest collective any rank entered."""
    own = _own(r)
    if not r.collectives:
        return f"rank {r.rank} made no collective yet"
    if r.collectives < latest:
        where = (
            f"it waits in {own} since {_clock(r.entered_at)}"
            if r.inside
            else f"its last, {own}, done"
        )
        return f"rank {r.rank} never entered {latest_name}: {where}"
    if r.inside:
        return f"rank {r.rank} waits in {own} since {_clock(r.entered_at)}"
    return f"rank {r.rank} entered {own} at {_clock(r.entered_at)} and moved on"


def stall_sentence(ranks: list[RankProgress]) -> str:
    latest = max((r.collectives for r in ranks), default=0)
    behind = [r.rank for r in ranks if r.collectives < latest]
    waiting = [r for r in ranks if latest and r.collectives == latest and r.inside]
    if not behind and not waiting:
        return "no rank waits in a collective; each rank's stack says where it is"
    name, parts = _latest_name(ranks), []
    if behind:
        parts.append(f"{_ranks(behind)} never entered {name}")
    if waiting:
        verb = "waits" if len(waiting) == 1 else "wait"
        where = "in it" if behind else f"in {name}"
        since = _clock(min(r.entered_at for r in waiting))
        parts.append(f"{_ranks([r.rank for r in waiting])} {verb} {where} since {since}")
    return "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
