"""What every strategy hands the training loop, and the parts most of them share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.config import TrainConfig
from training.data.batching import DataShard
from training.loop import StepFn
from training.observe.phases import phase
from training.strategies.clipping import GradClip, GradNorm
from training.strategies.optimizers import optimizer_class
from training.strategies.stepping import (
    ContextFactory,
    StepOptions,
    compile_clock,
    compile_note,
    compiled,
    step_notes,
    step_options,
)


@dataclass
class Plan:
    model: nn.Module  # the bare model as built (models.build): checkpoints hold its state dict
    net: nn.Module  # what the training step calls (a wrapper, or the model itself)
    eval_net: nn.Module  # what evaluation calls
    optimizer: torch.optim.Optimizer
    step: StepFn  # one optimizer step on a batch; returns the loss (not yet read)
    input_device: torch.device  # where batches go
    output_device: torch.device  # where the logits come out, so where labels go
    devices: list[str] | None = None  # started.devices, when not one per rank
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    started: dict[str, Any] = field(default_factory=dict)  # extra started fields
    # False where rank 0's optimizer does not hold the whole state (ZeRO partitions it).
    saves_optimizer: bool = True
    # Where the state is partitioned: a collective every rank joins at a checkpoint, returning
    # on rank 0 the whole state to save (None on the others) ...
    optimizer_gather: Callable[[], dict[str, Any] | None] | None = None
    # ... and what takes such a state back on resume; returns a note for the user.
    optimizer_restore: Callable[[dict[str, Any]], str] | None = None
    # Where the parameters are sharded (FSDP2): a collective every rank joins at a checkpoint,
    # returning on rank 0 the plain model's whole state dict (None on the others).
    model_gather: Callable[[], dict[str, Any] | None] | None = None
    # Entered around evaluation: where ranks may run different numbers of test batches, FSDP2
    # gathers its parameters once here, so that no forward needs a collective.
    evaluating: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
    # --precision: entered around evaluation, as the step enters it around each forward.
    autocast: ContextFactory = contextlib.nullcontext
    # fp16's gradient scaler: its state goes into checkpoints and comes back on resume.
    scaler: torch.amp.GradScaler | None = None
    # --compile: reads the seconds spent compiling so far, so the meter reports them apart.
    compile_clock: Callable[[], float] | None = None
    # Where ranks train on one batch together (tensor parallel): the slice of the data this
    # rank's group takes. None: its own slice, as the runtime's rank of its world.
    data_shard: DataShard | None = None
    # A language model's gradient clipping: its norm of the last step is the step's grad_norm.
    grad_clip: GradNorm | None = None

    def shard(self, rank: int, world_size: int) -> DataShard:
        """The slice of each global batch and of the test split this rank takes."""
        return self.data_shard or DataShard(rank, world_size)


def optimizer_make(
    cfg: TrainConfig, model: nn.Module, *, eager: bool | None = None
) -> torch.optim.Optimizer:
    """Adam, or SGD with momentum 0.9 (``--optimizer sgd``); without the compiler's hooks
    (training/strategies/optimizers.py) unless the run compiles or ``eager`` is False."""
    cls = optimizer_class(cfg.optimizer, eager=not cfg.compile if eager is None else eager)
    extra = {"momentum": 0.9} if cfg.optimizer == "sgd" else {}
    return cls(model.parameters(), lr=cfg.lr, **extra)


def step_default(
    net: nn.Module, optimizer: torch.optim.Optimizer, options: StepOptions | None = None
) -> StepFn:
    """One optimizer step on a batch, cut into ``options.accumulate`` micro-batches
    (``training.strategies.stepping``); returns the batch's mean loss."""
    options = options or StepOptions()
    scaler = options.scaler

    # The phases each part is timed as (training.observe.phases): where each rank's time goes.
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with phase("optimizer"):
            optimizer.zero_grad(set_to_none=True)
        k = options.accumulate
        pieces = list(zip(x.tensor_split(k), y.tensor_split(k), strict=True))
        total = torch.zeros((), device=y.device)
        for i, (xi, yi) in enumerate(pieces):
            # Only the last micro-batch's backward reduces gradients over the ranks.
            last = i == len(pieces) - 1
            with contextlib.nullcontext() if last else options.no_sync(), options.loss_context():
                with phase("forward"), options.autocast():
                    # Weighted by its share: the sum is the whole batch's mean loss (x 1.0,
                    # exact, without accumulation). float(): FSDP2's policy may return bf16.
                    loss = loss_of(net(xi), yi) * (len(yi) / len(y))
                with phase("backward"):
                    (loss if scaler is None else scaler.scale(loss)).backward()
            total += replicated(loss.detach())
        with phase("optimizer"):
            if options.clip is not None:
                if scaler is not None:
                    scaler.unscale_(optimizer)  # clipped at the gradients' own scale
                options.clip()
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)  # unscales first; skipped where a gradient overflowed
                scaler.update()
        return total

    return step


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of a classifier's logits (batch x classes) for its labels, or of a
    language model's (batch x sequence x vocabulary) for each next byte: one formula, the
    positions of a window counted as a classifier counts images. float(): FSDP2's policy may
    return bf16 logits."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten())


def replicated(value: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor: under loss_parallel it is a replicated DTensor."""
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


def plan_simple(
    cfg: TrainConfig,
    model: nn.Module,
    net: nn.Module,
    device: torch.device,
    *,
    no_sync: ContextFactory | None = None,
    autocast: bool = True,
    loss_context: ContextFactory = contextlib.nullcontext,
    **extra: Any,
) -> Plan:
    """A plan whose model sits on one device; ``net`` may wrap it. The step's options apply
    where the strategy declares them (the CLI refuses them elsewhere): a wrapper that reduces
    gradients in backward skips that for all micro-batches but the last (``no_sync``: DDP's
    own where not given), and ``--compile`` compiles ``net``, the wrapper included (PyTorch's
    recipe for DDP: its graph breaks at the buckets, so communication still overlaps
    backward). ``autocast`` False: the strategy casts by itself (FSDP2's policy)."""
    optimizer = optimizer_make(cfg, model)
    no_sync = no_sync or getattr(net, "no_sync", None)
    # A language model's gradients are clipped (training.strategies.clipping), as torchtitan's.
    clip = GradClip(model.parameters()) if cfg.language else None
    options = step_options(
        cfg, device, no_sync=no_sync or contextlib.nullcontext, autocast=autocast,
        loss_context=loss_context, clip=clip,
    )  # fmt: skip
    synchronised = "gradients are reduced over the ranks once, after the last"
    notes = [
        *extra.pop("notes", []),
        *step_notes(cfg, synchronised if no_sync else "", autocast=autocast),
    ]
    if cfg.compile:
        notes.append(compile_note(type(net).__name__))
        net = compiled(net)
    return Plan(
        model=model,
        net=net,
        eval_net=extra.pop("eval_net", model),
        optimizer=optimizer,
        step=step_default(net, optimizer, options),
        input_device=device,
        output_device=device,
        notes=notes,
        autocast=options.autocast,
        scaler=options.scaler,
        compile_clock=compile_clock if cfg.compile else None,
        grad_clip=clip,
        **extra,
    )
