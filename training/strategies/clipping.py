"""A language model's gradient clipping, and the norm it reports (``grad_norm``).

The norm is over the whole model's gradients, whichever way the strategy holds them: whole on
every rank (single, DDP: already averaged), as ``DTensor`` shards (FSDP2, tensor parallel, both:
each group of shards on one mesh and layout is normed by DTensor, whose ``full_tensor`` reduces
the partial norms), or one stage's share a rank (pipeline: the squares summed over the stages by
``reduce``). Every rank then scales its own gradients by the same factor, as one process would
scale the whole model's: torchtitan's ``clip_grad_norm_``, at nanoGPT's and torchtitan's max
norm of 1.0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

MAX_NORM = 1.0


class GradNorm(Protocol):
    """What a step event reads its ``grad_norm`` from: the norm the last step clipped at."""

    @property
    def last(self) -> torch.Tensor | None: ...


class NormRead:
    """A norm that a strategy's own optimizer computes and clips at (DeepSpeed's ZeRO, whose
    gradients live in its partitions, not in ``p.grad``), read when a step event asks."""

    def __init__(self, read: Callable[[], float | None]) -> None:
        self.read = read

    @property
    def last(self) -> torch.Tensor | None:
        norm = self.read()
        return None if norm is None else torch.as_tensor(norm)


class GradClip:
    """Called between backward and the optimizer's step: clips, and keeps the norm it found
    (``last``, on the device: read only when a step event reports it)."""

    def __init__(
        self,
        parameters: Iterable[nn.Parameter],
        *,
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        max_norm: float = MAX_NORM,
    ) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        self.reduce = reduce  # sums a rank's squared norm over the ranks that hold the rest
        self.max_norm = max_norm
        self.last: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        groups = _groups([p for p in self.parameters if p.grad is not None])
        squares = squared_norm(groups)
        if self.reduce is not None:
            squares = self.reduce(squares)
        norm = squares.sqrt()
        # Group by group: torch's foreach ops take no mix of plain tensors and DTensors (tensor
        # parallel without sequence parallel leaves the norms plain).
        for group in groups:
            torch.nn.utils.clip_grads_with_norm_(group, self.max_norm, norm)
        self.last = norm.detach()
        return norm


def _groups(parameters: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """The parameters with gradients, plain tensors together, DTensors per mesh and layout, in
    the parameters' order (the same on every rank)."""
    groups: dict[Any, list[nn.Parameter]] = {}
    for p in parameters:
        key = (p.device_mesh, p.placements) if isinstance(p, DTensor) else None
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def squared_norm(groups: list[list[nn.Parameter]]) -> torch.Tensor:
    """The sum of the squares of the groups' gradients (one reduction a DTensor group)."""
    total = torch.zeros(())
    for group in groups:
        norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None])
        whole = norm.full_tensor() if isinstance(norm, DTensor) else norm
        total = total.to(whole.device) + whole.float().square()
    return total
