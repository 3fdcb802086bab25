"""Profiles on request in a script's ranks (the run page's Profile button), as the engine's:
``training.observe.profiling`` records, writes and sums up each rank's trace; this module says
when, from inside the observer (observer.py), with no line of the script changed.

The request comes as a Stop does: SIGUSR2 to the launcher, which reads what the dashboard wrote
into ``<--profile-dir>/request.json`` and passes it on in its control file (control.py:
``profile``, ``profile_steps``). Every rank reads the file at each of the observer's windows and
carries the newest request it has not yet taken in its row of the window's all-gather
(PROFILE_FIGURES), which every rank enters at the same step: so every rank learns at once of a
request any of them saw (on several machines, only the first machine's launcher is asked), and
all start recording at the next step. A rank cannot start alone on its own reading of the
file: the ranks would read it at different steps.

Each rank then records the asked steps and writes ``<profile dir>/<N>/rank-<r>.json.gz``; at the
last one, which every rank reaches at the same step, one all-gather on the observer's group
brings every rank's trace and summary to rank 0, which writes the same ``profile`` events as
the engine's rank 0 (``recording``, then ``ready`` or ``refused``) to the observer's file; the
launcher passes them on. It fails open: a profiler that raises is said once on the rank's
stderr, the profile is refused with the reason, and the script goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

import torch
from torch.distributed import distributed_c10d

from training.observe.profiling import (
    Written,
    profile_end_fields,
    profiler_start,
    trace_path,
    trace_write,
)
from training.process.run_requests import ProfileRequest
from training.scripts.control import PROFILE_DIR_ENV
from trainyard.run import Control

# A rank's word in each window: the newest request it saw and has not taken (0: none).
PROFILE_FIGURES = ("profile", "profile_steps")

# c10d's own, never a timed wrapper: the observer's collectives are not the script's.
ALL_GATHER_OBJECT = distributed_c10d.all_gather_object
Send = Callable[..., Any]  # rank 0's channel to the launcher (EventChannel.send)
Gather = Callable[[Any], list[Any]]  # every rank's value, rank order (the observer's group)


class ScriptProfiles:
    """One rank's profiles on request, driven by the observer: `row` into each window,
    `agreed` after it, `stepped` at each step's end, `abandon` when the observer leaves."""

    def __init__(self, env: dict[str, str], *, rank: int, send: Send | None):
        folder = env.get(PROFILE_DIR_ENV)
        self.dir = Path(folder) if folder else None
        self.control = Control(env.get("TRAINYARD_CONTROL") if folder else None)
        self.rank = rank
        self.send = send
        self.taken = 0  # the newest request started (or refused) by every rank
        self.request: ProfileRequest | None = None
        self.profiler: Any = None
        self.failure = ""  # why this rank has no trace of the recording in progress
        self.said = False
        self.first_step = 0
        self.recorded = 0

    def row(self) -> list[float]:
        """PROFILE_FIGURES of this rank: the newest request in the control file not taken."""
        found = self.control.read()
        number, steps = found.get("profile"), found.get("profile_steps")
        if _count(number) and _count(steps) and number > self.taken and self.request is None:
            return [float(number), float(steps)]
        return [0.0] * len(PROFILE_FIGURES)

    def agreed(self, rows: list[list[float]], *, at: int, step: int) -> None:
        """After the window's all-gather of every rank's row (PROFILE_FIGURES from index `at`):
        the newest request any rank saw starts on every rank at the next step."""
        number, steps = max((int(row[at]), int(row[at + 1])) for row in rows)
        if self.request is not None or number <= self.taken or steps < 1:
            return
        self.taken = number
        self.request, self.first_step, self.recorded = ProfileRequest(number, steps), step + 1, 0
        self.failure = ""
        try:
            self.profiler = profiler_start(_device())
        except Exception as error:  # noqa: BLE001 - the script must not die of its profiler
            self._fail(f"could not start: {type(error).__name__}: {error}")
        if self.send is not None:
            self.send("profile", profile=number, state="recording", steps=steps,
                      first_step=step + 1)  # fmt: skip

    def stepped(self, *, gather: Gather) -> None:
        """A step ended (every rank ends each at the same point): the profile's last ends it."""
        if self.request is None:
            return
        self.recorded += 1
        if self.recorded >= self.request.steps:
            self._finish(gather)
        elif self.profiler is not None and not self.failure:
            self._call(self.profiler.step, "marking a step")

    def abandon(self, why: str) -> None:
        """No step will end the recording (the observer left, the script ended): the profiler
        stopped, nothing written; rank 0 says why the profile is not."""
        request, profiler = self.request, self.profiler
        self.request = self.profiler = None
        if profiler is not None:
            self._call(profiler.stop, "stopping")
        if request is not None and self.send is not None:
            message = f"{why} after {self.recorded} of its {request.steps} step(s)"
            self.send("profile", profile=request.profile, state="refused", steps=request.steps,
                      message=message)  # fmt: skip

    def _finish(self, gather: Gather) -> None:
        assert self.request is not None
        request, profiler = self.request, self.profiler
        self.request = self.profiler = None
        if profiler is not None:
            self._call(profiler.stop, "stopping")
        written: Written = f"rank {self.rank}: the profiler {self.failure}"
        if self.dir is None:
            written = f"rank {self.rank}: no {PROFILE_DIR_ENV} on its machine"
        elif profiler is not None and not self.failure:
            path = trace_path(self.dir, profile=request.profile, rank=self.rank)
            written = trace_write(profiler, path, rank=self.rank)
        try:
            gathered = gather(written)  # every rank, failed or not: none is left waiting in it
        except Exception as error:  # noqa: BLE001 - a rank that never came: no profile, no harm
            self._fail(f"found the ranks apart at the profile's end: {type(error).__name__}: "
                       f"{error}")  # fmt: skip
            gathered = [f"rank {self.rank}: {self.failure}"]
        if self.send is not None:
            self.send("profile", **profile_end_fields(
                request, first_step=self.first_step, recorded=self.recorded, gathered=gathered,
            ))  # fmt: skip

    def _call(self, method: Callable[[], Any], doing: str) -> None:
        try:
            method()
        except Exception as error:  # noqa: BLE001 - the script must not die of its profiler
            self._fail(f"raised {doing}: {type(error).__name__}: {error}")

    def _fail(self, why: str) -> None:
        """This rank's trace is lost (the profile is refused with `why`); said once per rank."""
        self.failure = self.failure or why
        if not self.said:
            self.said = True
            sys.stderr.write(f"trainyard's profiler {why}; no trace from this rank, the script "
                             "goes on\n")  # fmt: skip
            sys.stderr.flush()


def objects_gather(value: Any, *, group: Any, world_size: int) -> list[Any]:
    """Every rank's `value` over the observer's own group (``group``; None: this rank alone)."""
    if group is None or world_size <= 1:
        return [value]
    out: list[Any] = [None] * world_size
    ALL_GATHER_OBJECT(out, value, group=group)
    return out


def _device() -> torch.device:
    """Where the script computes, as the observer's clock finds it: the GPU it chose, if any."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
