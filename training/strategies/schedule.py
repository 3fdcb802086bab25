"""A language model's learning rate: linear warm-up, then a cosine down to a tenth (nanoGPT's
and torchtitan's shape), set before each optimizer step from the global step alone, so that a
resumed run continues on the curve where it left it, with no scheduler state to save."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.loop import StepFn

WARMUP_FRACTION = 0.05  # of the run's steps
WARMUP_MAX = 200  # torchtitan's default warm-up
FLOOR = 0.1  # the cosine ends at this fraction of --lr (nanoGPT's min_lr = lr / 10)


@dataclass(frozen=True)
class LRSchedule:
    peak: float  # --lr
    total: int  # the run's optimizer steps
    warmup: int

    def at(self, step: int) -> float:
        """The rate of global step ``step`` (1-based)."""
        if step <= self.warmup:
            return self.peak * step / self.warmup
        span = max(self.total - self.warmup, 1)
        progress = min((step - self.warmup) / span, 1.0)
        return self.peak * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress)))

    def words(self) -> str:
        return (
            f"Learning rate: linear warm-up over {self.warmup} step(s) to {self.peak:g}, then a "
            f"cosine down to {self.peak * FLOOR:g} at step {self.total}; gradients clipped at "
            "norm 1.0."
        )


def lr_schedule(peak: float, total: int) -> LRSchedule:
    warmup = max(1, min(WARMUP_MAX, round(total * WARMUP_FRACTION)))
    return LRSchedule(peak, max(total, 1), warmup)


def scheduled(
    step: StepFn, optimizer: torch.optim.Optimizer, schedule: LRSchedule, first: int
) -> StepFn:
    """``step`` with the rate of each global step set first, counting from ``first``."""
    count = [first]

    def step_at(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rate = schedule.at(count[0])
        for group in optimizer.param_groups:
            group["lr"] = rate
        count[0] += 1
        return step(x, y)

    return step_at
