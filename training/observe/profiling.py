"""Profiles on request: a ``torch.profiler`` trace of the next K steps, on every rank.

The request travels as a checkpoint request does: SIGUSR2 to ``requests_pid`` (rank 0) sets a
flag (``training.process.run_requests``), and ``<--profile-dir>/request.json`` says what to record,
``{"profile": N, "steps": K}`` (a signal carries no arguments). Rank 0 reads it at a step
boundary. Under torchrun every rank must start on the same step, so rank 0's answer reaches
the others by one all-reduce of two numbers, only on the steps that are reported anyway (every
rank takes those together; a single process looks at every step).

Each rank then records the next K steps (CPU activities; CUDA's too on a GPU), or up to the end
of the epoch, so that no evaluation lands in the trace, and writes its own gzipped Chrome trace,
``<profile dir>/<N>/rank-<r>.json.gz`` (Perfetto and chrome://tracing open it), with a summary:
its top operators by self CPU time (the profiler's ``key_averages``) and communication against
computation from the trace's events (``observe.trace_summary``). Rank 0 gathers the files and
summaries and reports them in a ``profile`` event: ``recording`` when it starts, ``ready`` when
every trace is written, ``refused`` when it cannot be recorded.

A user's script run records with the same functions (``profiler_start``, ``trace_write``,
``profile_end_fields``), from its ranks' observer, which agrees on the first step in its own
window instead (training/scripts/profiles.py).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from training.config import TrainConfig
from training.observe.trace_summary import STEP_MARK, overlap_of
from training.process.run_requests import (
    ProfileRequest,
    profile_request_read,
    profile_request_take,
)
from training.process.runtime import Runtime, all_gather, all_reduce_sum
from training.protocol import EventWriter, ProfileOp, ProfileRankSummary, ProfileTrace
from training.registry import strategy_get

TOP_OPS = 10  # operators per rank in the summary
# What a rank brings to the profile's end: its trace and summary, or why it has none.
Written = tuple[ProfileTrace, ProfileRankSummary] | str


def profile_dir_of(cfg: TrainConfig) -> str | None:
    """Where this run's profiles go, or None where it takes no profile requests."""
    if strategy_get(cfg.strategy).profile_refusal:
        return None
    return cfg.profile_dir


def trace_path(profile_dir: Path, *, profile: int, rank: int) -> Path:
    return profile_dir / str(profile) / f"rank-{rank}.json.gz"


def profiler_start(device: torch.device) -> profile:
    """A profiler recording from now on: CPU activities, CUDA's too on a GPU."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # A schedule that always records is the profiler's own default, but given, it makes
    # the profiler mark each step (ProfilerStep#0, #1, ...) in the trace for the viewer.
    profiler = profile(activities=activities, schedule=_always_record)
    profiler.start()
    return profiler


def trace_write(profiler: profile, path: Path, *, rank: int) -> Written:
    """The stopped profiler's trace written to ``path`` with its summary, or why it could not
    be (a full disk, an unwritable folder: the training goes on)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(path))
        trace = ProfileTrace(rank=rank, path=str(path), bytes=path.stat().st_size)
        return trace, rank_summary(profiler, path, rank=rank)
    except Exception as exc:  # noqa: BLE001 - said in the profile's event, not raised
        return f"rank {rank}: {type(exc).__name__}: {exc}"


def profile_end_fields(
    request: ProfileRequest, *, first_step: int, recorded: int, gathered: list[Written]
) -> dict[str, Any]:
    """The ``profile`` event once every rank's part is gathered: ``ready`` with each rank's
    trace and summary, or ``refused`` with what went wrong on which rank."""
    failures = [w for w in gathered if isinstance(w, str)]
    if failures:
        return dict(
            profile=request.profile, state="refused", steps=request.steps,
            message=("the profile could not be written: " + "; ".join(failures))[:1000],
        )  # fmt: skip
    done = [w for w in gathered if not isinstance(w, str)]
    return dict(
        profile=request.profile, state="ready", steps=request.steps, first_step=first_step,
        recorded_steps=recorded, traces=[t for t, _ in done], summary=[s for _, s in done],
    )  # fmt: skip


class ProfileRecorder:
    """One per rank, for the whole run; the loop calls ``after_step`` after every step."""

    def __init__(self, cfg: TrainConfig, rt: Runtime, events: EventWriter):
        self.rt, self.events = rt, events
        self.dir = Path(d) if (d := profile_dir_of(cfg)) else None
        self.request: ProfileRequest | None = None
        self.profiler: profile | None = None
        self.first_step = 0
        self.recorded = 0

    def after_step(self, *, step: int, reported: bool, last: bool) -> None:
        """``step`` is done; ``reported``: every rank reports it; ``last``: the epoch's last."""
        if self.profiler is not None:
            self.recorded += 1
            if self.request is not None and (self.recorded >= self.request.steps or last):
                self._finish()  # its stop() closes the last step's mark
            else:
                self.profiler.step()
        elif self.dir is not None and not last and (reported or not self.rt.distributed):
            # Without --profile-dir nothing can be asked (every rank has the same flags), so a
            # run that takes no profiles pays no all-reduce for them.
            request = self._request_agreed()
            if request is not None:
                self._start(request, first_step=step + 1)

    def _request_agreed(self) -> ProfileRequest | None:
        """Rank 0's request, known to every rank at once (one tiny all-reduce under torchrun)."""
        mine = self._request_taken() if self.rt.is_main else None
        if not self.rt.distributed:
            return mine
        number, steps = all_reduce_sum(
            self.rt, [float(mine.profile), float(mine.steps)] if mine else [0.0, 0.0]
        )
        return ProfileRequest(int(number), int(steps)) if steps >= 1 else None

    def _request_taken(self) -> ProfileRequest | None:
        if not profile_request_take():
            return None
        if self.dir is None:
            self.events.emit(
                "profile", profile=0, state="refused", steps=0,
                message="this training takes no profile requests (no --profile-dir, or a "
                "strategy that cannot record them)",
            )  # fmt: skip
            return None
        found = profile_request_read(self.dir)
        if isinstance(found, str):
            self.events.emit("profile", profile=0, state="refused", steps=0, message=found)
            return None
        return found

    def _start(self, request: ProfileRequest, *, first_step: int) -> None:
        self.request, self.first_step, self.recorded = request, first_step, 0
        self.profiler = profiler_start(self.rt.device)
        self.events.emit(
            "profile", profile=request.profile, state="recording", steps=request.steps,
            first_step=first_step,
        )  # fmt: skip

    def _finish(self) -> None:
        assert self.profiler is not None and self.request is not None and self.dir is not None
        profiler, request = self.profiler, self.request
        self.profiler = self.request = None
        profiler.stop()
        path = trace_path(self.dir, profile=request.profile, rank=self.rt.rank)
        written = trace_write(profiler, path, rank=self.rt.rank)
        gathered = all_gather(self.rt, written)  # every rank finishes on this step, failed or not
        self.events.emit(
            "profile",
            **profile_end_fields(
                request, first_step=self.first_step, recorded=self.recorded, gathered=gathered
            ),
        )


def _always_record(step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


def rank_summary(profiler: profile, path: Path, *, rank: int) -> ProfileRankSummary:
    """The rank's top operators by self CPU time, and communication against computation."""
    # The step marks' self time is the loop's own Python between operators: not an operator.
    averages = sorted(
        (a for a in profiler.key_averages() if not a.key.startswith(STEP_MARK)),
        key=lambda a: a.self_cpu_time_total,
        reverse=True,
    )
    ops = [
        ProfileOp(
            name=a.key,
            calls=int(a.count),
            self_cpu_seconds=a.self_cpu_time_total * 1e-6,
            cpu_seconds=a.cpu_time_total * 1e-6,
        )  # fmt: skip
        for a in averages[:TOP_OPS]
    ]
    with gzip.open(path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f).get("traceEvents", [])
    found = overlap_of(events)
    return ProfileRankSummary(
        rank=rank, ops=ops, wall_seconds=found.wall, computation_seconds=found.computation,
        communication_seconds=found.communication, overlap_seconds=found.overlap,
        device=found.device,
    )  # fmt: skip
