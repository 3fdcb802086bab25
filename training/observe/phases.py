"""Where each rank's time goes: the phases of its steps, on one clock per process.

Every process keeps one ``PhaseClock`` (``CLOCK``). A phase is entered as a context
(``phase("forward")``); phases nest, and time is charged to the innermost one only, so the
phases never count a second twice. The loop's step functions mark ``forward``, ``backward`` and
``optimizer`` (``training.strategies.common.step_default`` and DeepSpeed's step); the meter
(``observe.meter.Window``) reads the clock at a window's start and end. ``data`` is the loop's
own measure (``StepTiming.data_seconds``) and ``other`` is what is left of the window's wall
time: reporting, checkpoint requests, the parts of a step no phase marks. ``communication``
(time a rank is blocked in a collective that computation does not hide) and the bytes it sends
are charged to this clock by the collectives' wrappers: ``training.observe.collectives`` says
which collectives are seen and how their bytes are counted.

``--no-phases`` (``clock_off``) turns all of it off: no phase is timed, no collective wrapped,
DDP keeps its C++ all-reduce, and reports carry no phases. ``python -m training.bench phases``
measures what the clock costs against that.

How time is taken (``PhaseClock``'s timer): on the CPU each phase change reads the host's clock
and the seconds are added up at once. On a GPU the host's clock would read the time to queue the
work, and waiting for the device at each phase change would cost the overlap of kernels across a
phase boundary: there each phase change records a CUDA event on the current stream instead, and
the segments between events are added up when the meter reads the clock (once a window), after
one wait for the last event. DDP's hooks run on autograd's device thread there; their events go
on the stream in its order, so that thread keeps time too (on the CPU, Gloo's threads do not:
their time overlaps the rank's own). The hand-over works on the segments: the phase's time after
a hand-over is held apart until the next hand-over (it was the phase's own) or the phase's end
(it was waiting for the last one: communication). Two limits, not yet measured on a GPU: a mark
goes on the stream current at the phase change, so a phase entered under another stream (FSDP2
issues its collectives under streams of its own) spans two; and ``data`` stays the host's time,
which overlaps the device's phases when the device runs behind. ``.ci/gpu-check`` checks the sum
against the wall time (within 5%) on a GPU machine.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
from threading import get_ident
from typing import Any, Final, Protocol

import torch

# The phases the clock keeps (data and other are the meter's).
CLOCK_PHASES: Final = ("forward", "backward", "optimizer", "communication")
# Every phase a report gives, in the order they are shown.
PHASES: Final = ("data", *CLOCK_PHASES, "other")
# The label of a phase's time after a hand-over, until it is known whether that hand-over was
# the last (then it is communication) or not (then it is the phase's own).
_TAIL: Final = "tail"
# The wall clock arrivals are taken on (ranks compare theirs); a test's own phase timer stays
# apart from it.
_WALL_CLOCK: Final = time.time


class HostTimer:
    """Marks are the host's clock: a segment's seconds are known at once."""

    on_device = False

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float:
        return end - start

    def wait(self, last: float) -> None:
        """Nothing to wait for: the host's time has passed."""


class CudaTimer:
    """Marks are CUDA events on ``device``'s current stream: a segment is the device's time
    between two points of the stream, known once the device got there (``wait``). The run's
    device, not the thread's current one: a one-process run placed on another GPU than the
    first (``--gpus 1``) never calls ``torch.cuda.set_device``, and events on GPU 0's idle
    stream would time the host's queueing (and open a context on a GPU the run was not given)."""

    on_device = True

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return float(start.elapsed_time(end)) / 1000  # milliseconds

    def wait(self, last: torch.cuda.Event) -> None:
        last.synchronize()


class Timer(Protocol):
    """What the clock marks phase changes with (a test drives its own)."""

    on_device: bool  # marks are read later, after ``wait``, from any thread (PhaseClock)

    def mark(self) -> Any: ...

    def seconds(self, start: Any, end: Any) -> float: ...

    def wait(self, last: Any) -> None: ...


class _Phase:
    """``with`` one phase on a clock. One per phase name, made once: entering costs no
    allocation, and the clock's stack, not this object, holds what is open (so it nests)."""

    __slots__ = ("clock", "name")

    def __init__(self, clock: PhaseClock, name: str) -> None:
        self.clock, self.name = clock, name

    def __enter__(self) -> None:
        self.clock.enter(self.name)

    def __exit__(self, *exc: object) -> None:
        self.clock.leave()


class PhaseClock:
    """Seconds per phase (innermost phase charged) and bytes sent, in this process.

    Each phase change takes a mark of ``timer``; the time between two marks (a segment) is
    charged to the phase open between them. A host timer's segments are added up at once; a
    device timer's are kept and added up when the clock is read (the meter reads it once a
    window), after one wait for the last mark: a phase change never waits for the device.

    On the host, only the thread that made the clock keeps time (collectives called from Gloo's
    threads add their bytes only: their time overlaps the rank's own). On a device, marks go on
    the stream, whose order is what counts, so any thread keeps time (DDP's hooks run on
    autograd's device thread); the lock keeps the stack and the segments whole."""

    def __init__(self, timer: Timer | None = None) -> None:
        self.sent_bytes = 0
        # Arrivals at collectives (issue 33, stragglers by arrival): how many this process
        # entered and the sum of the wall-clock times it entered them at, after arrival_base
        # (small numbers, summed without losing the milliseconds).
        self.arrivals = 0
        self.arrival_sum = 0.0
        self.arrival_base = _WALL_CLOCK()
        self.enabled = True  # False: --no-phases (clock_off)
        self._lock = threading.Lock()
        self._owner = get_ident()
        self._contexts = {name: _Phase(self, name) for name in CLOCK_PHASES}
        self.timer_use(timer or HostTimer())

    def timer_use(self, timer: Timer) -> None:
        """Keep time with ``timer`` from here on (from zero)."""
        self.timer = timer
        self.totals = dict.fromkeys((*CLOCK_PHASES, _TAIL), 0.0)
        self._on_device = timer.on_device
        self._stack: list[str] = []
        self._since: Any = None  # the last phase change's mark
        self._segments: list[tuple[Any, Any, str]] = []  # a device's, not added up yet
        self._tail: list[tuple[Any, Any]] = []  # a device's segments labelled _TAIL
        # (stack index, phase): that phase's time is _TAIL since a hand-over (handed_over).
        self._handed: tuple[int, str] | None = None

    def phase(self, name: str) -> _Phase:
        return self._contexts[name]

    def _keeps_time(self) -> bool:
        return self._on_device or get_ident() == self._owner

    # enter and leave are what each phase costs: on the host no lock is taken (one thread).
    def enter(self, name: str) -> None:
        if self._on_device:
            with self._lock:
                self._charge()
                self._stack.append(name)
        elif get_ident() == self._owner:
            self._charge()
            self._stack.append(name)

    def leave(self) -> None:
        if self._on_device:
            with self._lock:
                self._leave()
        elif get_ident() == self._owner:
            self._leave()

    def _leave(self) -> None:
        self._charge()
        if self._stack.pop() == _TAIL:  # the phase ended after its last hand-over
            self._tail_settle("communication")

    def _charge(self) -> None:
        """A phase change: the segment since the last one is the innermost phase's."""
        now = self.timer.mark()
        if self._stack:
            if self._on_device:
                self._keep(self._since, now, self._stack[-1])
            else:  # the host's: its seconds at once
                self.totals[self._stack[-1]] += self.timer.seconds(self._since, now)
        self._since = now

    def _keep(self, start: Any, end: Any, label: str) -> None:
        """A device's segment, added up when the clock is read."""
        if label == _TAIL:
            self._tail.append((start, end))
        else:
            self._segments.append((start, end, label))

    def handed_over(self) -> None:
        """Asynchronous communication was handed over: if no other hand-over follows before the
        enclosing phase ends, what that phase does from here is waiting for it (DDP's reducer,
        after its last bucket, waits for the all-reduces still running)."""
        if not self._keeps_time():
            return
        with self._lock:
            self._charge()
            if self._handed is not None:  # the one before was not the last
                index, name = self._handed
                self._stack[index] = name
                self._tail_settle(name)
            if self._stack:
                self._handed = (len(self._stack) - 1, self._stack[-1])
                self._stack[-1] = _TAIL

    def _tail_settle(self, label: str) -> None:
        """What was charged as _TAIL is ``label``'s."""
        self._handed = None
        self.totals[label] += self.totals[_TAIL]
        self.totals[_TAIL] = 0.0
        if self._tail:
            self._segments += [(start, end, label) for start, end in self._tail]
            self._tail.clear()

    def entered(self, count: float, *, arrives: bool) -> None:
        """This process enters a collective now that sends ``count`` bytes (any thread: DDP's
        hooks may run on autograd's); ``arrives``: one all its group's ranks enter alike (not a
        point-to-point send), whose time on the wall clock (not the phases' timer: ranks
        compare theirs with each other's) counts as an arrival."""
        now = _WALL_CLOCK() - self.arrival_base
        with self._lock:
            self.sent_bytes += int(count)
            if arrives:
                self.arrivals += 1
                self.arrival_sum += now

    def arrivals_read(self) -> tuple[int, float]:
        """The collectives entered so far and the sum of their times: a window subtracts two
        (``arrival_mean``)."""
        with self._lock:
            return self.arrivals, self.arrival_sum

    def read(self) -> tuple[float, ...]:
        """The totals so far, CLOCK_PHASES order, then the bytes sent: a window subtracts two.
        A device's segments are added up here, after waiting for the last one."""
        with self._lock:
            if self._segments:
                self.timer.wait(self._since)  # the last mark: the others are before it
                for start, end, label in self._segments:
                    self.totals[label] += self.timer.seconds(start, end)
                self._segments.clear()
            return (*(self.totals[name] for name in CLOCK_PHASES), float(self.sent_bytes))


CLOCK = PhaseClock()


def arrival_mean(start: tuple[int, float], end: tuple[int, float]) -> tuple[int, float]:
    """The collectives entered between two ``arrivals_read`` and the mean wall-clock time
    (Unix seconds) they were entered at; (0, 0.0) where none was."""
    count = end[0] - start[0]
    if count <= 0:
        return 0, 0.0
    return count, CLOCK.arrival_base + (end[1] - start[1]) / count


def lateness(arrivals: list[tuple[int, float]]) -> list[float] | None:
    """Each rank's mean arrival at the window's collectives after the median of the other
    ranks' (seconds; below 0: before them), from every rank's ``arrival_mean``, rank order; None
    where it cannot be told: one rank, a rank that entered none, or ranks that entered different
    numbers of them (pipeline stages, ranks in different groups), whose means are not of the
    same collectives. Two ranks on one machine share its clock; on several machines their
    clocks' offset (NTP's: about a millisecond) is in it."""
    counts = {count for count, _ in arrivals}
    if len(arrivals) < 2 or len(counts) != 1 or 0 in counts:
        return None
    means = [mean for _, mean in arrivals]
    return [
        mean - statistics.median(means[:rank] + means[rank + 1 :])
        for rank, mean in enumerate(means)
    ]


_UNTIMED: Final = contextlib.nullcontext()


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """Time the enclosed work as ``name`` (one of CLOCK_PHASES) on this process's clock."""
    return CLOCK.phase(name) if CLOCK.enabled else _UNTIMED


def clock_off() -> None:
    """--no-phases: nothing is timed from here on (call before the strategy is built)."""
    CLOCK.enabled = False


def clock_for(device: torch.device) -> None:
    """On a GPU the phases are CUDA events' (host timers would read the time to queue)."""
    CLOCK.timer_use(CudaTimer(device) if device.type == "cuda" else HostTimer())


def method_timed(owner: Any, name: str, phase_name: str) -> None:
    """Time ``owner.<name>``'s calls as ``phase_name``: the instance's own attribute, so that a
    caller looking it up on the instance (a pipeline schedule, its stage's chunks) is timed."""
    if not CLOCK.enabled:
        return
    method = getattr(owner, name)

    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with CLOCK.phase(phase_name):
            return method(*args, **kwargs)

    setattr(owner, name, timed)
