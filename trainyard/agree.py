"""Agreement between a script's ranks: a Stop or a checkpoint request is acted on by every rank
at the same step, or by none, so that no rank is left waiting in a collective the others left.

Each rank reads the request where it finds it (the launcher's control file on its machine);
the ranks then take the largest over all of them with one all-reduce of a single integer on a
Gloo group of this library's own (the script's groups, NCCL or Gloo, are never used), every
`every` calls (TRAINYARD_AGREE_EVERY, default 1: each call). Determined's `_preempt.py` does the
same with a broadcast from its chief.

The one module of `trainyard` that imports torch, and only inside a script that has set up its
process group (torch is then imported already).
"""

from __future__ import annotations

from typing import Any


class Agreement:
    """The largest of each rank's value, on every rank; the value alone where there is no
    process group of several ranks to agree in."""

    def __init__(self) -> None:
        self.group: Any = None
        self.distributed = False  # True from the first call made in a process group

    def _ready(self) -> bool:
        """Whether there are ranks to agree with. Asked again until the script has set up its
        process group: every rank calls the library at the same places, so all find it set up
        at the same call, and make the group there, as new_group asks."""
        if not self.distributed:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                self.group = dist.new_group(backend="gloo")
                self.distributed = True
        return self.distributed

    def largest(self, value: int) -> int:
        if not self._ready():
            return value
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return int(tensor.item())

    def close(self) -> None:
        if self.group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)
            self.group = None
