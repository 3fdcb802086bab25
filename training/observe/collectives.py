"""The communication phase: torch's collectives timed on the phase clock
(``training.observe.phases``), and the bytes this rank sends counted.

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
  (``phases.method_timed``), what is left of the schedule is ``other``.
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

Each collective a rank enters through these wrappers (not the point-to-point sends and
receives, whose numbers differ between a pipeline's stages, nor the waits) also marks its
arrival on the clock's wall-clock (``PhaseClock.entered``): a window's mean arrival, compared
between ranks (``phases.lateness``), says who the others wait for (protocol 1.14). DDP's bucket
all-reduces arrive when its hook calls ``dist.all_reduce``, as soon as the bucket is ready.

Nothing here is wrapped with the clock off (``--no-phases``, ``phases.clock_off``).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh

# The clock is read as phases.CLOCK at each call, not imported by name: the process has one
# clock, and a test that puts its own in phases.CLOCK reaches the collectives' time too.
from training.observe import phases

F = TypeVar("F", bound=Callable[..., Any])


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


# Not arrivals at a collective (``phases.PhaseClock.entered``): point-to-point sends and
# receives, which the ranks of a pipeline make in different numbers and orders, and the waits
# for a collective already entered.
NOT_ARRIVALS: Final = frozenset(
    {"send", "recv", "batch_isend_irecv", "_batch_p2p", "_wait_batch_p2p", "wait_tensor"}
)


def _sends(counted: Counted, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    try:
        return counted(args, kwargs)
    except Exception:  # noqa: BLE001 - counting never fails a collective
        return 0


def clock_safely(call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """``call`` on the clock; False where it raised: the clock is then turned off, said once
    on stderr, and the collective around it goes on untimed (a clock that fails, e.g. a CUDA
    event that cannot be recorded, never fails the training's own collective)."""
    try:
        call(*args, **kwargs)
    except Exception as error:  # noqa: BLE001
        if phases.CLOCK.enabled:
            phases.clock_off()
            sys.stderr.write(f"trainyard's phase clock stopped: {type(error).__name__}: {error}; "
                             "training goes on, untimed\n")  # fmt: skip
        return False
    return True


def _collective_enter(depth: int, counted: Counted, args: Any, kwargs: Any, arrives: bool) -> None:
    if depth == 0:  # the outermost: its bytes and arrival, once
        phases.CLOCK.entered(_sends(counted, args, kwargs), arrives=arrives)
    phases.CLOCK.enter("communication")


def _timed(collective: F, counted: Counted, *, arrives: bool) -> F:
    # Plain code, no context manager of a generator's: FSDP2 calls these a few times a layer.
    # The clock is checked at each call: one turned off (--no-phases, an observer that left)
    # keeps no time, and no device event is recorded that no one would read.
    @functools.wraps(collective)
    def timed(*args: Any, **kwargs: Any) -> Any:
        clock = phases.CLOCK
        if not clock.enabled or torch.compiler.is_compiling():  # compiling: traced, not run
            return collective(*args, **kwargs)
        depth = getattr(_INSIDE, "depth", 0)
        if not clock_safely(_collective_enter, depth, counted, args, kwargs, arrives):
            return collective(*args, **kwargs)
        _INSIDE.depth = depth + 1
        try:
            return collective(*args, **kwargs)
        finally:
            _INSIDE.depth = depth
            clock_safely(clock.leave)

    timed.__trainyard_timed__ = True  # type: ignore[attr-defined]
    return timed  # type: ignore[return-value]


def module_timed(module: Any, sends: dict[str, Counted]) -> None:
    """Replace ``module``'s functions named in ``sends`` by timed ones, once: callers that look
    them up as ``module.<name>`` at call time are timed and counted."""
    for name, counted in sends.items():
        collective = getattr(module, name, None)
        if collective is not None and not getattr(collective, "__trainyard_timed__", False):
            setattr(module, name, _timed(collective, counted, arrives=name not in NOT_ARRIVALS))


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
    if phases.CLOCK.enabled:
        module_timed(schedules, PIPELINE_SENDS)


def hook_timed(hook: F) -> F:
    """A DDP communication hook whose call is communication and whose hand-over marks the
    start of backward's wait for it (see the module's docstring); ``hook`` itself with the
    clock off."""
    if not phases.CLOCK.enabled:
        return hook

    # wraps: DDP reads the hook's signature (through __wrapped__) and logs its name.
    @functools.wraps(hook)
    def timed(state: Any, bucket: Any) -> Any:
        clock = phases.CLOCK
        if not clock.enabled or not clock_safely(clock.enter, "communication"):
            return hook(state, bucket)
        try:
            future = hook(state, bucket)
        finally:
            clock_safely(clock.leave)
        clock_safely(clock.handed_over)
        return future

    return timed  # type: ignore[return-value]
