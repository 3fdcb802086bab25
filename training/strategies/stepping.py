"""What an optimizer step does besides forward, backward and update: the step's options
(``--accumulate``, ``--precision``, ``--compile``), for the strategies that declare them.

- ``--accumulate K``: the step's share of the batch on this rank (``batch_size x K`` images,
  ``training.data.batching.rank_batches``) is cut into K micro-batches whose gradients add up before
  one update. Each micro-batch's mean loss is weighted by its share of the images, so the update
  is the one a batch K times larger takes. Every micro-batch but the last runs inside the
  strategy's ``no_sync`` (DDP's ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``):
  gradients are reduced over the ranks once per step, not K times.
- ``--precision bf16``: ``torch.autocast`` (bfloat16) around each forward and its loss, on the
  CPU and on GPUs; ``fp16`` (GPUs only, the registry refuses it on the CPU) adds
  ``torch.amp.GradScaler``, which scales the loss so that small float16 gradients do not flush
  to zero and skips a step whose gradients overflowed. Weights, gradients and optimizer state
  stay float32 (so do checkpoints). FSDP2 uses its own idiom instead, a ``MixedPrecisionPolicy``
  (``training.strategies.fsdp``).
- ``--compile``: ``torch.compile`` (inductor) of what the step calls. Compiling happens lazily in
  the first steps; ``compile_clock`` reads how long it took, so the meter can report it apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from training.config import TrainConfig

ContextFactory = Callable[[], contextlib.AbstractContextManager[Any]]

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepOptions:
    """How ``step_default``'s step runs; the defaults are a plain fp32 step on one batch."""

    accumulate: int = 1  # micro-batches a step
    autocast: ContextFactory = contextlib.nullcontext  # entered around each forward and loss
    scaler: torch.amp.GradScaler | None = None  # fp16: loss scaling
    no_sync: ContextFactory = (
        contextlib.nullcontext
    )  # entered around every micro-batch but the last
    # A language model's: entered around each micro-batch's loss and backward (tensor
    # parallel's loss_parallel, whose logits stay split by vocabulary) ...
    loss_context: ContextFactory = contextlib.nullcontext
    # ... and called between the last backward and the update: clips, keeps the norm.
    clip: Callable[[], torch.Tensor] | None = None


def autocast_for(precision: str, device: torch.device) -> ContextFactory:
    """``torch.autocast`` in ``precision``'s dtype on ``device``'s type; nothing for fp32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return partial(torch.autocast, device_type=device.type, dtype=dtype)


def scaler_for(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's gradient scaler (None otherwise): float16's range is too narrow for small
    gradients, bfloat16's is float32's."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def step_options(
    cfg: TrainConfig,
    device: torch.device,
    *,
    no_sync: ContextFactory = contextlib.nullcontext,
    autocast: bool = True,
    loss_context: ContextFactory = contextlib.nullcontext,
    clip: Callable[[], torch.Tensor] | None = None,
) -> StepOptions:
    """The run's step options on ``device``; ``autocast`` False where the strategy casts by
    itself (FSDP2's mixed-precision policy)."""
    return StepOptions(
        accumulate=cfg.accumulate,
        autocast=autocast_for(cfg.precision, device) if autocast else contextlib.nullcontext,
        scaler=scaler_for(cfg.precision, device),
        no_sync=no_sync,
        loss_context=loss_context,
        clip=clip,
    )


def step_notes(cfg: TrainConfig, synchronised: str = "", *, autocast: bool = True) -> list[str]:
    """What the step's options do in this run, for ``started.notes``; ``synchronised``: how
    the strategy skips the reduction of the micro-batches before the last; ``autocast`` False
    where the strategy says how it casts (FSDP2)."""
    notes = []
    if cfg.accumulate > 1:
        per_rank = cfg.batch_size * cfg.accumulate
        sync = f"; {synchronised}" if synchronised else ""
        notes.append(
            f"Each optimizer step adds up the gradients of {cfg.accumulate} batches of "
            f"{cfg.batch_size} (--accumulate {cfg.accumulate}), {per_rank} images a rank, each "
            f"batch's loss weighted by its share{sync}. "
            "Steps (--steps-per-epoch, --log-interval) count optimizer steps; images/s counts "
            "every image."
        )
    if autocast and cfg.precision in AUTOCAST_DTYPES:
        notes.append(precision_note(cfg.precision))
    return notes


def precision_note(precision: str) -> str:
    dtype = "bfloat16" if precision == "bf16" else "float16"
    scaler = (
        ", and a GradScaler scales the loss (a step whose gradients overflow is skipped)"
        if precision == "fp16"
        else ""
    )
    return (
        f"--precision {precision}: each forward and its loss run under torch.autocast "
        f"({dtype}), evaluation too{scaler}; weights, gradients, optimizer state and "
        "checkpoints stay float32."
    )


def compiled(net: nn.Module) -> nn.Module:
    """``torch.compile(net)`` (inductor; on the CPU it needs a C compiler, ``cc``)."""
    result: nn.Module = torch.compile(net)  # type: ignore[assignment]
    return result


def compile_note(what: str) -> str:
    return (
        f"--compile: torch.compile (inductor) compiles {what} during the first step(s); the "
        "seconds it takes are reported as compile_seconds in the step and epoch events, apart "
        "from compute_seconds and images_per_second. Evaluation runs the model uncompiled (a "
        "second graph for eval mode would cost as much again), and checkpoints hold the plain "
        "model's keys."
    )


def compile_clock() -> float:
    """Seconds torch.compile has spent compiling in this process so far (dynamo's own total:
    every frame's compile and every backward's)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))
