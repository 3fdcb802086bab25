"""What a rank's Chrome trace says about communication against computation, and their overlap.

Computed from the trace's own events (``traceEvents``, complete events ``"ph": "X"`` with
``ts``/``dur`` in microseconds), as Holistic Trace Analysis does for GPU kernels, and on the CPU
too (HTA reads only GPU kernels, so a Gloo run on CPUs would get nothing from it):

- communication: the collectives' events, ``c10d::...`` (the call on the training thread),
  ``gloo:...`` (Gloo's own threads doing the work), ``nccl...``/``ncclKernel...`` (NCCL's calls
  and kernels) and ``record_param_comms``;
- computation: every other operator. On the CPU an operator that calls a collective on its own
  thread (autograd's function running DDP's hook) is blocked in it meanwhile: that time is taken
  out of the thread's computation. Where the trace has GPU kernels, both come from the kernels
  alone (what the device did), as HTA does.
- overlap: time when both ran at once, communication hidden behind computation.

Each is a union of intervals, so nested operators and parallel threads never count a
microsecond twice. Pure Python: no torch, so that tests and readers can use it alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Interval = tuple[float, float]
COMMUNICATION_MARKS = ("c10d::", "gloo:", "nccl", "record_param_comms")
CPU_CATEGORIES = ("cpu_op", "user_annotation")
# The profiler's own step marks span whole steps: they are not an operator's time. The trace
# names them ProfilerStep#0, #1, ...; key_averages groups them as ProfilerStep*.
STEP_MARK = "ProfilerStep"


@dataclass(frozen=True)
class Overlap:
    device: str  # "cpu" or "cuda": which events the figures come from
    wall: float  # seconds from the first event to the last
    computation: float
    communication: float
    overlap: float


def is_communication(name: str) -> bool:
    lowered = name.lower()
    return any(mark in lowered for mark in COMMUNICATION_MARKS)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged where they touch or overlap, in order."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: Sequence[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Where two merged, ordered interval lists both hold."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """``a`` less ``b`` (both merged and ordered)."""
    out: list[Interval] = []
    for start, end in a:
        cursor = start
        for b_start, b_end in b:
            if b_end <= cursor or b_start >= end:
                continue
            if b_start > cursor:
                out.append((cursor, b_start))
            cursor = max(cursor, b_end)
        if cursor < end:
            out.append((cursor, end))
    return out


def _complete(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        e for e in events
        if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur"), (int, float)) and isinstance(e.get("name"), str)
        and not e["name"].startswith(STEP_MARK)
    ]  # fmt: skip


def _span(event: dict[str, Any]) -> Interval:
    return (float(event["ts"]), float(event["ts"]) + float(event["dur"]))


def _cpu_computation(ops: list[dict[str, Any]]) -> list[Interval]:
    """Per thread, its operators' time less its own collectives' (it is blocked in them)."""
    threads: dict[Any, tuple[list[Interval], list[Interval]]] = {}
    for event in ops:
        compute, comm = threads.setdefault(event.get("tid"), ([], []))
        (comm if is_communication(event["name"]) else compute).append(_span(event))
    pieces = [subtract(union(compute), union(comm)) for compute, comm in threads.values()]
    return union(interval for piece in pieces for interval in piece)


def overlap_of(trace_events: Iterable[dict[str, Any]]) -> Overlap:
    """Computation, communication and their overlap in a trace's events, in seconds."""
    events = _complete(trace_events)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if kernels:
        device, chosen = "cuda", kernels
        computation = union(_span(e) for e in kernels if not is_communication(e["name"]))
    else:
        device = "cpu"
        chosen = [e for e in events if e.get("cat") in CPU_CATEGORIES]
        computation = _cpu_computation(chosen)
    communication = union(_span(e) for e in chosen if is_communication(e["name"]))
    spans = [_span(e) for e in chosen]
    wall = max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0
    us = 1e-6
    return Overlap(
        device=device,
        wall=wall * us,
        computation=length(computation) * us,
        communication=length(communication) * us,
        overlap=length(intersect(computation, communication)) * us,
    )
