"""What every trainer does around its epochs, whoever trains them: build the model (resuming its
weights), say ``started``, then drive the epochs to ``finished``.

The shared loop (``training.engine``) and Hogwild's parent (``training.strategies.hogwild``) both
call these, each handing in how it trains one epoch; so the two cannot drift apart in what
their ``started`` event holds or when a run ends. Nothing here imports a strategy.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training import checkpoint
from training.checkpoint import ResumePoint
from training.config import TrainConfig
from training.data.datasets import Dataset, dataset_meta
from training.loop import Tested
from training.models.build import BuiltModel, model_build_for, weights_mismatch
from training.observe.profiling import profile_dir_of
from training.observe.reporting import (
    data_source_log,
    finished_emit,
    log_to,
    started_fields,
    target_reached,
)
from training.process.runtime import Runtime
from training.protocol import EventWriter, SharedTensor


@dataclass(frozen=True)
class EpochStart:
    """One epoch to train: picklable, so Hogwild's parent sends it to its processes as is."""

    epoch: int
    step_base: int  # global steps taken before it
    skip: int  # its batches a resumed run had trained already


EpochTrain = Callable[[EpochStart], tuple[int, Tested]]  # returns (global step, test figures)


def model_build(cfg: TrainConfig) -> tuple[BuiltModel, dict[str, Any] | None]:
    """The model built for the run's dataset (``training.models.build``), with the checkpoint's
    weights when resuming (else those of --weights); and the checkpoint."""
    # Before the model and the data: a bad --resume (another model's) fails at once.
    state = checkpoint.load_for(cfg) if cfg.resume else None
    # Same seed on every rank: identical initial weights (DDP also broadcasts rank 0's).
    torch.manual_seed(cfg.seed)
    meta = dataset_meta(cfg.dataset, Path(cfg.data_dir), cfg.data_path)
    weights = cfg.weights if state is None else None
    built = model_build_for(
        name=cfg.model, meta=meta, weights=weights, model_size=cfg.model_size,
        seq_len=cfg.seq_len,
    )  # fmt: skip
    if state is not None:
        mismatch = weights_mismatch(built.model.state_dict(), state["model"])
        if mismatch:
            raise ValueError(
                f"the checkpoint {cfg.resume} does not fit {cfg.model} as built for "
                f"{cfg.dataset}: {mismatch}"
            )
        built.model.load_state_dict(state["model"])
        if cfg.weights:
            built.notes.append(
                f"--weights {cfg.weights} was not loaded: the checkpoint's weights are resumed."
            )
    return built, state


@dataclass(frozen=True)
class Ranks:
    """The ``started`` fields that say who trains where: the trainer's to fill."""

    devices: list[str]
    pids: list[int]
    machines: list[str]
    launcher_pid: int  # the process the caller started
    notes: list[str]
    shared_tensors: list[SharedTensor]
    world: int = 0  # world_size where it is not the runtime's (Hogwild's processes)
    extra: dict[str, Any] = field(default_factory=dict)  # the strategy's own started fields
    warnings: list[str] = field(default_factory=list)  # logged after the event
    # Ranks with a batch of their own, where not every rank (a tensor-parallel group shares one).
    batch_ranks: int = 0


def started_emit(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    *,
    data: Dataset,
    built: BuiltModel,
    per_epoch: int,
    start_epoch: int,
    ranks: Ranks,
) -> None:
    """The ``started`` event and the logs that follow it."""
    events.emit(
        "started",
        **started_fields(
            cfg, rt, data, per_epoch, start_epoch, world=ranks.world, batch_ranks=ranks.batch_ranks
        ),
        model=cfg.model,
        model_info=built.info,
        devices=ranks.devices,
        pids=ranks.pids,
        machines=ranks.machines,
        launcher_pid=ranks.launcher_pid,
        # The process that writes the events takes the checkpoint requests (SIGUSR1).
        requests_pid=os.getpid(),
        profile_dir=profile_dir_of(cfg),
        notes=[*built.notes, *ranks.notes],
        shared_tensors=ranks.shared_tensors,
        **ranks.extra,
    )
    data_source_log(events, rt, data)
    for message in ranks.warnings:
        log_to(events, rt, message, "warning")
    if start_epoch > cfg.epochs:
        log_to(
            events, rt, f"The checkpoint already covers {cfg.epochs} epoch(s); nothing to train."
        )


def epochs_drive(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    *,
    resume: ResumePoint,
    epoch_train: EpochTrain,
    evaluate: Callable[[], Tested],
    t_start: float,
) -> None:
    """Train the epochs from where ``resume`` says, stop early at --target-accuracy, and say
    ``finished``. Every rank calls this: the target's answer is a collective."""
    start = resume.start_epoch
    step = resume.step
    tested: Tested = (None, 0.0)
    last = cfg.epochs
    for epoch in range(start, cfg.epochs + 1):
        skip = resume.skip_batches if epoch == start else 0
        step, tested = epoch_train(EpochStart(epoch, step, skip))
        if target_reached(events, rt, cfg, epoch=epoch, test_accuracy=tested[1]):
            last = epoch
            break
    if start > cfg.epochs:
        tested = evaluate()
    finished_emit(
        events, cfg, *tested, start_epoch=start, step=step, t_start=t_start, last_epoch=last
    )
