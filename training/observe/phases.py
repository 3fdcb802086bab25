"""Where each rank's time goes: the phases of its steps, and the bytes it sends.

Every process keeps one ``PhaseClock`` (``CLOCK``). A phase is entered as a context
(``phase("forward")``); phases nest, and time is charged to the innermost one only, so the
phases never count a second twice. The loop's step functions mark ``forward``, ``backward`` and
``optimizer`` (``training.strategies.common.step_default`` and DeepSpeed's step); the meter
(``observe.meter.Window``) reads the clock at a window's start and end. ``data`` is the loop's
own measure (``StepTiming.data_seconds``) and ``other`` is what is left of the window's wall
time: reporting, checkpoint requests, the parts of a step no phase marks.

``communication`` is time a rank is blocked in a collective that computation does not hide:

- Every collective the process calls through ``torch.distributed`` (``all_reduce``,
  ``all_gather``, ``reduce_scatter``, ``broadcast``, ``send``, ``recv``, ``barrier`` and their
  ``_tensor``/``_single`` forms) is wrapped on torchrun's ranks (``collectives_time``): a
  synchronous call's whole duration is communication (FSDP2's all-gathers and reduce-scatters,
  ZeRO's broadcasts, the ranks' all-reduces of figures); an asynchronous one's launch only, its
  wait stays in the phase that waits (so DeepSpeed's and ZeroRedundancyOptimizer's overlapped
  broadcasts count in ``optimizer``).
- DDP's reducer all-reduces its gradient buckets asynchronously while backward goes on. Its
  communication hook (the default all-reduce or ``--comm-hook``'s) is wrapped (``hook_timed``):
  the hook's own call is communication (PowerSGD's bucket-by-bucket waits on Gloo), and the time
  from the last bucket's hand-over to the end of backward, when the reducer waits for the
  all-reduces still running and unpacks them, is taken out of backward as communication. What
  overlaps backward is hidden, as the name says; on the CPU Gloo's threads share the rank's
  cores with backward, so hidden communication still slows backward down.
- Tensor parallel's DTensor redistributions call the functional collectives
  (``torch.distributed._functional_collectives``), wrapped as well: on Gloo the op is only
  launched and the rank blocks in ``wait_tensor`` when the result is first used, so launch and
  wait are communication (checked with 2 ranks, one late by 0.5 s: launch 1 ms, wait 0.5 s).
- A pipeline schedule (``torch.distributed.pipelining``) launches its stages' sends and
  receives in batches and then waits for them: both are communication (``pipelining_time``), so
  a stage waiting for a slow one shows there; its stage's chunks are forward and backward
  (``method_timed``), what is left of the schedule is ``other``.
- Collectives torch calls below Python (DDP's buffer broadcast) are not seen: they stay in the
  phase that called them. The autograd backward of a functional collective called with
  gradients on (DTensor does not: its own backward calls them again) has its wait timed, not its
  bytes counted. A collective that another timed one calls (pipelining's
  batches of ``batch_isend_irecv``, funcol's deprecated aliases) is timed, and counted once.

``communication_bytes`` are the bytes this rank sends by the ring algorithms' count, from the
tensors handed to the collectives: an all-reduce of B bytes over N ranks sends 2(N-1)/N x B (a
reduce-scatter then an all-gather), an all-gather (N-1) x its input, a reduce-scatter (N-1)/N x
its input, a broadcast B from its source (forwarding by the others is not counted), a send B.
DDP's buckets hold every gradient: a DDP step of a model of P float32 parameters sends
2(N-1)/N x 4P bytes (with ``--comm-hook fp16`` half of it; PowerSGD's factors are what its
all-reduces take).

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
import threading
import time
from collections.abc import Callable, Iterator
from threading import get_ident
from typing import Any, Final, Protocol, TypeVar

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh

# The phases the clock keeps (data and other are the meter's).
CLOCK_PHASES: Final = ("forward", "backward", "optimizer", "communication")
# Every phase a report gives, in the order they are shown.
PHASES: Final = ("data", *CLOCK_PHASES, "other")
# The label of a phase's time after a hand-over, until it is known whether that hand-over was
# the last (then it is communication) or not (then it is the phase's own).
_TAIL: Final = "tail"

F = TypeVar("F", bound=Callable[..., Any])


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

    def sent(self, count: float) -> None:
        with self._lock:
            self.sent_bytes += int(count)

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


# --- what each collective sends (ring algorithms) ---------------------------------------------

# Bytes a rank sends, as a multiple of the collective's input bytes, over N ranks.
RING: Final[dict[str, Callable[[int], float]]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,  # a reduce-scatter, then an all-gather
    "all_gather": lambda n: n - 1,  # the input, to every other rank
    "reduce_scatter": lambda n: (n - 1) / n,  # the other ranks' shares of the input
    "all_to_all": lambda n: (n - 1) / n,  # the other ranks' chunks of the input
}


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, *names: str) -> Any:
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[index] if len(args) > index else None


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _ranks(kwargs: dict[str, Any]) -> int:
    return int(dist.get_world_size(kwargs.get("group")))


def _all_reduce(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    return RING["all_reduce"](_ranks(kwargs)) * _bytes(_arg(args, kwargs, 0, "tensor"))


def _all_gather(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    # all_gather(tensor_list, tensor), all_gather_into_tensor(output, input).
    sent = _bytes(_arg(args, kwargs, 1, "tensor", "input_tensor", "input"))
    return RING["all_gather"](_ranks(kwargs)) * sent


def _reduce_scatter(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    # reduce_scatter(output, input_list), reduce_scatter_tensor(output, input).
    sent = _bytes(_arg(args, kwargs, 1, "input_list", "input"))
    return RING["reduce_scatter"](_ranks(kwargs)) * sent


def _broadcast(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    source = _arg(args, kwargs, 1, "src")
    return _bytes(_arg(args, kwargs, 0, "tensor")) if source == dist.get_rank() else 0


def _send(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    return _bytes(_arg(args, kwargs, 0, "tensor"))


def _nothing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    return 0


def _batch_sends(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    ops = _arg(args, kwargs, 0, "p2p_op_list", "p2p_ops") or []
    return sum(_bytes(op.tensor) for op in ops if getattr(op.op, "__name__", "") == "isend")


Counted = Callable[[tuple[Any, ...], dict[str, Any]], float]

SENDS: Final[dict[str, Counted]] = {
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather,
    "all_gather_single": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_single": _reduce_scatter,
    "broadcast": _broadcast,
    "send": _send,
    "recv": _nothing,
    # Not isend/irecv themselves: a P2POp (pipelining's sends) must be given the very functions
    # torch defines ("Invalid ``op``" otherwise); their batch is timed and counted instead.
    "batch_isend_irecv": _batch_sends,
    "barrier": _nothing,
}


def group_size(group: Any) -> int:
    """The ranks of a functional collective's ``group``: a (DeviceMesh, dim) pair (DTensor's),
    a 1-D DeviceMesh, a list of ranks (or of lists, one a group), a ProcessGroup or its name."""
    if isinstance(group, tuple):
        mesh, dim = group
        return int(mesh.size(dim))
    if isinstance(group, DeviceMesh):
        return int(group.size())
    if isinstance(group, list):
        return len(group[0]) if group and isinstance(group[0], list) else len(group)
    if isinstance(group, str):
        return int(dist.distributed_c10d._get_group_size_by_name(group))  # type: ignore[arg-type]
    return int(group.size())


def _functional(ring: str, group_at: int) -> Counted:
    """Bytes of a functional collective (``funcol.<name>(self, ..., group)``): its input
    ``self`` times the ring's multiple for the group's size."""

    def counted(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
        n = group_size(_arg(args, kwargs, group_at, "group"))
        return RING[ring](n) * _bytes(_arg(args, kwargs, 0, "self"))

    return counted


# torch.distributed._functional_collectives (funcol): DTensor's redistributions (tensor
# parallel's all-reduces, all-gathers and reduce-scatters) call these. On Gloo the op is only
# launched; the rank blocks in ``wait_tensor`` (when the AsyncCollectiveTensor is first used).
FUNCTIONAL_SENDS: Final[dict[str, Counted]] = {
    "all_reduce": _functional("all_reduce", 2),
    "all_gather_single": _functional("all_gather", 2),
    "all_gather_tensor": _functional("all_gather", 2),
    "reduce_scatter_single": _functional("reduce_scatter", 3),
    "reduce_scatter_tensor": _functional("reduce_scatter", 3),
    "all_to_all_single": _functional("all_to_all", 3),
    "wait_tensor": _nothing,
}

# A collective that another timed one calls (funcol's deprecated aliases, pipelining's batches
# of torch.distributed's batch_isend_irecv) is timed, but its bytes are the outer one's.
_INSIDE = threading.local()


@contextlib.contextmanager
def _collective(counted: Counted, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
    depth = getattr(_INSIDE, "depth", 0)
    if depth == 0:
        with contextlib.suppress(Exception):  # counting never fails a collective
            CLOCK.sent(counted(args, kwargs))
    _INSIDE.depth = depth + 1
    try:
        with CLOCK.phase("communication"):
            yield
    finally:
        _INSIDE.depth = depth


def _timed(collective: F, counted: Counted) -> F:
    @functools.wraps(collective)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # traced into a graph: nothing runs here
            return collective(*args, **kwargs)
        with _collective(counted, args, kwargs):
            return collective(*args, **kwargs)

    timed.__trainyard_timed__ = True  # type: ignore[attr-defined]
    return timed  # type: ignore[return-value]


def module_timed(module: Any, sends: dict[str, Counted]) -> None:
    """Replace ``module``'s functions named in ``sends`` by timed ones, once: callers that look
    them up as ``module.<name>`` at call time are timed and counted."""
    for name, counted in sends.items():
        collective = getattr(module, name, None)
        if collective is not None and not getattr(collective, "__trainyard_timed__", False):
            setattr(module, name, _timed(collective, counted))


def collectives_time() -> None:
    """Wrap ``torch.distributed``'s collectives in this process (a torchrun rank), once: every
    caller that looks them up as ``dist.<name>`` (the strategies, FSDP2, DDP's Python hooks,
    ZeRO, DeepSpeed's comm) is timed and counted; so are the functional collectives DTensor
    calls (tensor parallel)."""
    module_timed(dist, SENDS)
    module_timed(funcol, FUNCTIONAL_SENDS)


# torch.distributed.pipelining.schedules: a schedule launches its stages' sends and receives in
# batches (``_batch_p2p``, which calls torch's isend/irecv itself or batch_isend_irecv) and then
# blocks in ``_wait_batch_p2p`` until the other stage has sent or taken them.
PIPELINE_SENDS: Final[dict[str, Counted]] = {
    "_batch_p2p": _batch_sends,
    "_wait_batch_p2p": _nothing,
}


def pipelining_time(schedules: Any) -> None:
    """Time a pipeline schedule's sends, receives and waits as communication (the module
    ``torch.distributed.pipelining.schedules``, passed by the pipeline strategy, which imports it:
    an import of seconds the other strategies do not pay)."""
    if CLOCK.enabled:
        module_timed(schedules, PIPELINE_SENDS)


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


def hook_timed(hook: F) -> F:
    """A DDP communication hook whose call is communication and whose hand-over marks the
    start of backward's wait for it (see the module's docstring); ``hook`` itself with the
    clock off."""
    if not CLOCK.enabled:
        return hook

    # wraps: DDP reads the hook's signature (through __wrapped__) and logs its name.
    @functools.wraps(hook)
    def timed(state: Any, bucket: Any) -> Any:
        with CLOCK.phase("communication"):
            future = hook(state, bucket)
        CLOCK.handed_over()
        return future

    return timed  # type: ignore[return-value]
