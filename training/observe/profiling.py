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
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from torch.profiler import ProfilerAction, ProfilerActivity, profile

from training.config import TrainConfig
from training.observe.trace_summary import STEP_MARK, overlap_of
from training.process.run_requests import (
    PROFILE_MAX_STEPS,
    PROFILE_REQUEST_FILE,
    profile_request_take,
)
from training.process.runtime import Runtime, all_gather, all_reduce_sum
from training.protocol import EventWriter, ProfileOp, ProfileRankSummary, ProfileTrace
from training.registry import strategy_get

TOP_OPS = 10  # operators per rank in the summary


@dataclass(frozen=True)
class ProfileRequest:
    profile: int  # the request's number, echoed in its events (the dashboard's row)
    steps: int


def profile_dir_of(cfg: TrainConfig) -> str | None:
    """Where this run's profiles go, or None where it takes no profile requests."""
    if strategy_get(cfg.strategy).profile_refusal:
        return None
    return cfg.profile_dir


def profile_request_read(profile_dir: Path) -> ProfileRequest | str:
    """The request in ``request.json``, or why it is not one."""
    try:
        asked = json.loads((profile_dir / PROFILE_REQUEST_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"no readable {PROFILE_REQUEST_FILE} in {profile_dir}: {exc}"
    if not isinstance(asked, dict):
        return f"{PROFILE_REQUEST_FILE} must hold a JSON object, got {asked!r}"
    number, steps = asked.get("profile", 0), asked.get("steps")
    if not (_is_int(number) and _is_int(steps) and 1 <= steps <= PROFILE_MAX_STEPS and number >= 0):
        return (
            f"{PROFILE_REQUEST_FILE} must hold integers profile (>= 0) and steps "
            f"(1..{PROFILE_MAX_STEPS}), got {asked!r}"
        )
    return ProfileRequest(profile=number, steps=steps)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


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
        activities = [ProfilerActivity.CPU]
        if self.rt.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.request, self.first_step, self.recorded = request, first_step, 0
        # A schedule that always records is the profiler's own default, but given, it makes
        # the profiler mark each step (ProfilerStep#0, #1, ...) in the trace for the viewer.
        self.profiler = profile(activities=activities, schedule=_always_record)
        self.profiler.start()
        self.events.emit(
            "profile", profile=request.profile, state="recording", steps=request.steps,
            first_step=first_step,
        )  # fmt: skip

    def _finish(self) -> None:
        assert self.profiler is not None and self.request is not None and self.dir is not None
        profiler, request = self.profiler, self.request
        self.profiler = self.request = None
        profiler.stop()
        path = self.dir / str(request.profile) / f"rank-{self.rt.rank}.json.gz"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(path))
            trace = ProfileTrace(rank=self.rt.rank, path=str(path), bytes=path.stat().st_size)
            written: tuple[ProfileTrace, ProfileRankSummary] | str = (
                trace,
                rank_summary(profiler, path, rank=self.rt.rank),
            )
        except Exception as exc:  # a full disk, an unwritable folder: the training goes on
            written = f"rank {self.rt.rank}: {type(exc).__name__}: {exc}"
        gathered = all_gather(self.rt, written)  # every rank finishes on this step, failed or not
        failures = [w for w in gathered if isinstance(w, str)]
        if failures:
            self.events.emit(
                "profile", profile=request.profile, state="refused", steps=request.steps,
                message=("the profile could not be written: " + "; ".join(failures))[:1000],
            )  # fmt: skip
            return
        done = [w for w in gathered if not isinstance(w, str)]
        self.events.emit(
            "profile", profile=request.profile, state="ready", steps=request.steps,
            first_step=self.first_step, recorded_steps=self.recorded,
            traces=[t for t, _ in done], summary=[s for _, s in done],
        )  # fmt: skip


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
