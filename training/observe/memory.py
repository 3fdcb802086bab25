"""What each rank holds: bytes of parameters, gradients and optimizer state, and its peak memory.

The ``epoch`` event's ``memory`` (protocol 1.7): one ``MemoryEntry`` per rank, so that sharded
strategies (FSDP2, ZeRO) show their 1/N beside DDP's full copy. Bytes are what this process
holds locally: a DTensor counts its local shard (``to_local()``), not the global tensor. The peak
is CUDA's allocator's on a GPU (``max_memory_allocated``), else the process's peak resident set
(``getrusage``), which includes the interpreter, torch and the data: compare it between ranks and
strategies, not with the byte counts.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import torch

from training.process.runtime import Runtime, all_gather
from training.protocol import MemoryEntry

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes this process holds of ``tensor``: a DTensor's local shard, else the tensor; none
    on the meta device (a pipeline stage's view of the other stages' parameters)."""
    if tensor.is_meta:
        return 0
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def _tensors_bytes(tensors: Iterable[Any]) -> int:
    return sum(tensor_bytes(t) for t in tensors if isinstance(t, torch.Tensor))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The tensors of the optimizer's per-parameter state (Adam's moments, SGD's momentum).

    A ZeroRedundancyOptimizer's are those of its local optimizer (``.optim``), which holds and
    steps this rank's share: the wrapper's own ``state`` is empty, and after ``load_state_dict``
    holds None for the other ranks' parameters."""
    # Looked up, not imported: torch.distributed.optim imports DTensor and FSDP (0.3 s of every
    # rank's start), and an optimizer is a ZeroRedundancyOptimizer only once it is imported.
    zero = sys.modules.get("torch.distributed.optim")
    sharded = zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer)
    local = cast("ZeroRedundancyOptimizer", optimizer).optim if sharded else optimizer
    return sum(_tensors_bytes(state.values()) for state in local.state.values() if state)


def peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_entry(
    *, rank: int, parameters: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> MemoryEntry:  # fmt: skip
    """This process's entry: what ``parameters`` (and their gradients) and ``optimizer`` hold."""
    params = list(parameters)
    return MemoryEntry(
        rank=rank,
        parameter_bytes=_tensors_bytes(params),
        gradient_bytes=_tensors_bytes(p.grad for p in params if p.grad is not None),
        optimizer_state_bytes=optimizer_state_bytes(optimizer),
        peak_bytes=peak_bytes(device),
    )


def memory_report(
    rt: Runtime, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> list[MemoryEntry]:
    """Every rank's entry, rank order (one all-gather: every rank calls this)."""
    mine = memory_entry(
        rank=rt.rank, parameters=model.parameters(), optimizer=optimizer, device=rt.device
    )
    return list(all_gather(rt, mine))
