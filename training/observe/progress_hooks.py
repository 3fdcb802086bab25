"""What feeds a rank's progress record (progress.py): the observer calls ``stepped`` and
``forwarded``; every collective on every process group is seen entering through c10d's own hook
(``ProcessGroup.register_pre_hook``: DDP's bucket all-reduces, FSDP2's, DTensor's and the
script's own calls alike, on any backend). A collective is left when the rank next moves (a
forward, a step, the next collective): a rank stuck waiting in one, synchronously or at DDP's
end of backward for its async all-reduces, never does. One Python call per collective, on the
calling thread: no post hook, no work futures (whose callbacks would take the GIL from the
backend's threads, and which Gloo's coalesced works lack).

Groups made after the first step (a DeviceMesh's, ``new_group``) are hooked at the next step;
the observer's own group is not the script's and is left out. Fail-open: a hook that raises
would raise inside the script's collective, so it swallows its error, says it once and goes
quiet, and the record stops being watched; the hooks come out at the rank's next step (taking
one out while c10d runs the group's hooks would pull the list from under it).
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from training.observe.progress import ProgressWriter

HOOK_ID = 0x7A7D  # ours among a group's hooks (unregistered by it)
# c10d's HookOpName, as torch.distributed names the call.
FALLBACK_SECONDS = 0.1  # a forward said at most this often once the observer's hooks are out
OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}


class ProgressHooks:
    def __init__(self, folder: Path, rank: int):
        self.writer = ProgressWriter(folder, rank)
        self.hooked: list[Any] = []  # the process groups hooked
        self.ignored: Any = None  # the observer's own group
        self.broken = False
        self.groups_seen = 0
        self.handles: list[Any] = []  # the fallback's hooks
        self.steps = 0  # the fallback's count, from the observer's
        self.forward_seen = 0.0

    def stepped(self, step: int) -> None:
        if self.broken:
            self.remove()
            return
        self._safely(self.writer.stepped, step)
        self._safely(self.groups_hook)

    def forwarded(self) -> None:
        self._safely(self.writer.forwarded)

    def moved(self) -> None:
        """The rank is past its collective (a backward returned: DDP's all-reduces are done)."""
        self._safely(self.writer.moved)

    def entered(self, op: str) -> None:
        """A collective of the observer's own group (not hooked), which every rank enters."""
        self._safely(self.writer.entered, op)

    def fallback(self, *, step: int) -> None:
        """The observer stopped measuring (its hooks out): this record keeps being fed by hooks
        of its own, any optimizer's step and a forward at most every FALLBACK_SECONDS, so
        that a stall is still told."""
        from torch.nn.modules import module as modules
        from torch.optim import optimizer as optimizers

        self.steps = step

        def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.steps += 1
            self.stepped(self.steps)

        def forwarded(module: Any, args: Any) -> None:
            if torch.compiler.is_compiling():
                return
            now = time.monotonic()
            if now - self.forward_seen >= FALLBACK_SECONDS:
                self.forward_seen = now
                self.forwarded()

        self.handles += [
            optimizers.register_optimizer_step_post_hook(stepped),
            modules.register_module_forward_pre_hook(forwarded),
        ]

    def groups_hook(self) -> None:
        """Every process group known now, hooked once (cheap to call at each step: the count
        of groups is compared first)."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        groups = dist.distributed_c10d._world.pg_map
        if len(groups) == self.groups_seen:
            return
        self.groups_seen = len(groups)
        for group in list(groups):
            if group is self.ignored or any(group is known for known in self.hooked):
                continue
            if not hasattr(group, "register_pre_hook"):  # before torch 2.13: no collective seen
                return
            group.register_pre_hook(HOOK_ID, self._entered)
            self.hooked.append(group)

    def _entered(self, args: Any) -> None:
        if self.broken:
            return
        try:
            name = args.name.name.lower()
            self.writer.entered(OP_NAMES.get(name, name))
        except Exception as error:  # noqa: BLE001 - never raise inside the script's collective
            self.fail(error)

    def _safely(self, call: Any, *args: Any) -> None:
        if self.broken:
            return
        try:
            call(*args)
        except Exception as error:  # noqa: BLE001
            self.fail(error)

    def fail(self, error: Exception) -> None:
        if self.broken:
            return
        self.broken = True
        sys.stderr.write(f"trainyard's stall watch stopped on this rank: {type(error).__name__}: "
                         f"{error}; the script goes on\n")  # fmt: skip
        with contextlib.suppress(Exception):  # its folder gone with the launcher
            self.writer.unwatched()

    def remove(self) -> None:
        """Hooks out and the record unwatched: this rank's steps are no longer counted. Never
        from inside a hook of the groups'."""
        self.broken = True
        for group in self.hooked:
            with contextlib.suppress(Exception):  # a group destroyed has no hooks left
                group.unregister_pre_hook(HOOK_ID)
        for handle in self.handles:
            handle.remove()
        self.hooked, self.handles = [], []
        with contextlib.suppress(Exception):  # its folder gone with the launcher
            self.writer.unwatched()
