"""What every strategy hands the training loop, and the parts most of them share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.batching import DataShard
from training.config import TrainConfig
from training.loop import StepFn


@dataclass
class Plan:
    model: nn.Module  # the bare model as built (training.models): checkpoints hold its state dict
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
    # Where ranks train on one batch together (tensor parallel): the slice of the data this
    # rank's group takes. None: its own slice, as the runtime's rank of its world.
    data_shard: DataShard | None = None

    def shard(self, rank: int, world_size: int) -> DataShard:
        """The slice of each global batch and of the test split this rank takes."""
        return self.data_shard or DataShard(rank, world_size)


def optimizer_make(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


def step_default(net: nn.Module, optimizer: torch.optim.Optimizer) -> StepFn:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def plan_simple(
    cfg: TrainConfig, model: nn.Module, net: nn.Module, device: torch.device, **extra: Any
) -> Plan:
    """A plan whose model sits on one device; ``net`` may wrap it."""
    optimizer = optimizer_make(cfg, model)
    return Plan(
        model=model,
        net=net,
        eval_net=extra.pop("eval_net", model),
        optimizer=optimizer,
        step=step_default(net, optimizer),
        input_device=device,
        output_device=device,
        **extra,
    )
