"""Per-step timings and what the step and epoch events report from them.

Each step is timed in two parts: ``data`` (taking the batch out of the resident tensors,
normalising it and moving it to the device) and ``compute`` (forward, backward, optimizer step).
Together they show why a strategy is slow: waiting for data, computing, or (for the difference to
wall time) waiting for other ranks. Times are host-side: on a GPU the work is queued
asynchronously, so a step's compute time includes waiting for the GPU only when the queue is
full, and the loss read at each report (``Window.row``) is where the host catches up.

Each rank also reports where the window's wall time went (protocol 1.9): the phase clock's
forward, backward, optimizer and communication seconds and bytes sent (``training.observe.phases``),
with ``data`` and ``other`` (the rest of the wall time) they add up to it. On a GPU the clock's
phases are the device's time (CUDA events), read at the report, where the host catches up.

With ``--compile`` a step's time spent compiling (torch.compile's own clock, read around the
step) is taken out of its compute time and out of the window's elapsed time, and reported apart
as ``compile_seconds``: the images/s of the epoch that compiled are those of training alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from training.observe.phases import CLOCK, CLOCK_PHASES, arrival_mean, lateness
from training.process.runtime import Runtime, all_gather_floats

_PROCESS = psutil.Process()
ROW_FIELDS = (
    "loss_sum", "steps", "images", "data_seconds", "compute_seconds", "elapsed", "rss",
    "compile_seconds", *CLOCK_PHASES, "communication_bytes", "wall", "collectives", "arrival",
)  # fmt: skip


@dataclass(frozen=True)
class StepTiming:
    loss: torch.Tensor  # on the device; read only when a report is made
    images: int
    data_seconds: float
    compute_seconds: float  # without compile_seconds
    compile_seconds: float = 0.0  # torch.compile compiling during the step (--compile)


@dataclass
class Window:
    """What happened since the last report; the loss stays on the device until read, so a
    CUDA step does not wait for the GPU."""

    device: torch.device
    loss_sum: torch.Tensor = field(init=False)
    steps: int = 0
    images: int = 0
    data_seconds: float = 0.0
    compute_seconds: float = 0.0
    compile_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    # The phase clock's totals at the start (training.observe.phases): the window's are the
    # difference.
    clock_start: tuple[float, ...] = field(default_factory=CLOCK.read)
    arrivals_start: tuple[int, float] = field(default_factory=CLOCK.arrivals_read)

    def __post_init__(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)

    def add(self, timing: StepTiming) -> None:
        self.loss_sum += timing.loss.detach().to(torch.float64)
        self.steps += 1
        self.images += timing.images
        self.data_seconds += timing.data_seconds
        self.compute_seconds += timing.compute_seconds
        self.compile_seconds += timing.compile_seconds

    def row(self) -> list[float]:
        """This process's figures, in ROW_FIELDS order (what ranks exchange)."""
        # The clock first: on a GPU it waits for the window's last event, so that the wall time
        # holds the device's work its phases count, not only the host's queueing of it.
        phases = [now - then for now, then in zip(CLOCK.read(), self.clock_start, strict=True)]
        # Compiling is reported apart: the window's throughput is that of training alone. The
        # phases add up to the whole wall time (compiling falls in forward and backward).
        wall = max(time.perf_counter() - self.started, 1e-9)
        elapsed = max(wall - self.compile_seconds, 1e-9)
        collectives, arrival = arrival_mean(self.arrivals_start, CLOCK.arrivals_read())
        return [
            float(self.loss_sum.item()),
            float(self.steps),
            float(self.images),
            self.data_seconds,
            self.compute_seconds,
            elapsed,
            float(rss_bytes()),
            self.compile_seconds,
            *phases,
            wall,
            float(collectives),
            arrival,
        ]


def rss_bytes() -> int:
    return int(_PROCESS.memory_info().rss)


def window_report(rt: Runtime, window: Window, replicas: int = 1) -> dict[str, Any]:
    """The event fields for ``window`` over all ranks (one all-gather when distributed)."""
    return report_from_rows(all_gather_floats(rt, window.row()), replicas)


def report_from_rows(rows: list[list[float]], replicas: int = 1) -> dict[str, Any]:
    """train_loss, images_per_second (all ranks), rank 0's data_seconds, compute_seconds and
    rss_bytes, and ``ranks``: the same per rank (row ``i`` is rank ``i``); rank 0's
    compile_seconds where some rank compiled in the window. Where ``replicas`` ranks train on
    each image together (a tensor-parallel group), each counts it: the total counts it once."""
    per_rank = [dict(zip(ROW_FIELDS, row, strict=True)) for row in rows]
    late = lateness([(int(r["collectives"]), r["arrival"]) for r in per_rank])
    loss_sum = sum(r["loss_sum"] for r in per_rank)
    steps = sum(r["steps"] for r in per_rank)
    ranks = [
        {
            "rank": i,
            "images_per_second": round(r["images"] / r["elapsed"], 1),
            "data_seconds": round(r["data_seconds"], 4),
            "compute_seconds": round(r["compute_seconds"], 4),
            "rss_bytes": int(r["rss"]),
            **(phase_fields(r) if CLOCK.enabled else {}),
            **(arrival_fields(late[i], r["collectives"]) if late and CLOCK.enabled else {}),
        }
        for i, r in enumerate(per_rank)
    ]
    compiling = any(r["compile_seconds"] > 0 for r in per_rank)
    return {
        "train_loss": finite(loss_sum / steps if steps else math.nan),
        "images_per_second": round(sum(r["images_per_second"] for r in ranks) / replicas, 1),
        "data_seconds": ranks[0]["data_seconds"],
        "compute_seconds": ranks[0]["compute_seconds"],
        "rss_bytes": ranks[0]["rss_bytes"],
        "ranks": ranks,
        **({"compile_seconds": round(per_rank[0]["compile_seconds"], 3)} if compiling else {}),
    }


def phase_fields(row: dict[str, float]) -> dict[str, Any]:
    """A rank's phases of its window (protocol 1.9, ``observe.phases``): seconds each, other
    what the rest leaves of the wall time (never below 0), and the bytes it sent."""
    seconds = {name: max(row[name], 0.0) for name in CLOCK_PHASES}
    other = max(row["wall"] - row["data_seconds"] - sum(seconds.values()), 0.0)
    return {
        **{f"{name}_seconds": round(value, 4) for name, value in seconds.items()},
        "other_seconds": round(other, 4),
        "communication_bytes": int(row["communication_bytes"]),
    }


def arrival_fields(late: float, collectives: float) -> dict[str, Any]:
    """1.14: how late a rank entered the window's collectives, per collective, after the median
    of the other ranks (``phases.lateness``), and how many it entered."""
    return {"arrived_late_seconds": round(late, 5), "collectives": int(collectives)}


def finite(value: float) -> float | None:
    # JSON has no NaN or Infinity; a diverged loss is reported as null.
    return round(value, 6) if math.isfinite(value) else None
