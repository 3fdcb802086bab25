"""Agreement between a script's ranks: a Stop or a checkpoint request is acted on by every rank
at the same step, or by none, so that no rank is left waiting in a collective the others left.

Each rank reads the request where it finds it (the launcher's control file on its machine);
the ranks then take the largest over all of them with one all-reduce of a few integers on a Gloo
group of this library's own (the script's groups, NCCL or Gloo, are never used). Determined's
`_preempt.py` does the same with a broadcast from its chief.

How often (``Pace``): about every TRAINYARD_AGREE_SECONDS (0.25 s) of the script's time, or
every TRAINYARD_AGREE_EVERY calls where that is set. Time alone cannot say when: each rank's
clock would pick another call, and a rank would wait in an all-reduce the others never make. So
each agreement also agrees on the next one: every rank proposes the calls that fill the time at
its own pace, and all take the smallest proposal, so they meet again at the same call. A step of
16 ms then agrees every 15 steps, a step of 2 s at every one.

The one module of `trainyard` that imports torch, and only inside a script that has set up its
process group (torch is then imported already).
"""

from __future__ import annotations

import time
from typing import Any

# The most calls between two agreements, however fast the calls come: a Stop is seen within them.
MAX_EVERY = 1000


class Pace:
    """Which calls agree: the first, then every `fixed` calls, or else the calls that fill about
    `seconds` at the pace measured since the last agreement (the ranks agree on the number)."""

    def __init__(self, *, fixed: int | None, seconds: float):
        self.fixed = fixed
        self.seconds = seconds
        self.calls = 0
        self.due = 1
        self.since: tuple[float, int] | None = None  # (clock, calls) at the last agreement

    def tick(self) -> bool:
        """One call more; whether it is the one to agree at."""
        self.calls += 1
        return self.calls >= self.due

    def proposal(self) -> int:
        """The calls until the next agreement, by this rank's pace."""
        if self.fixed is not None:
            return self.fixed
        if self.since is None:
            return 1  # no pace known yet: agree again at the next call, and measure
        elapsed, calls = time.monotonic() - self.since[0], self.calls - self.since[1]
        # At most twice the calls measured: two calls a microsecond apart (should_stop right
        # after checkpoint_requested) say nothing of the step's pace; doubling finds it in a
        # few agreements without ever overshooting it twofold.
        most = min(MAX_EVERY, 2 * calls)
        if elapsed <= 0:
            return most
        return max(1, min(most, int(self.seconds * calls / elapsed)))

    def agreed(self, every: int) -> None:
        self.due = self.calls + max(1, every)
        self.since = (time.monotonic(), self.calls)


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

    def alone(self) -> bool:
        """Whether there is no other rank to agree with (a request is then read at every call:
        no collective to save)."""
        return not self._ready()

    def largest(self, value: int) -> int:
        [found] = self.largest_each([value])
        return found

    def largest_each(self, values: list[int]) -> list[int]:
        """Each value's largest over the ranks, in one all-reduce (a smallest is the largest of
        the negated values)."""
        if not self._ready():
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return [int(value) for value in tensor.tolist()]

    def close(self) -> None:
        if self.group is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group(self.group)
            self.group = None
