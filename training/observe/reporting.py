"""The events and log lines every strategy writes the same way: ``started``'s common fields,
``epoch``, ``finished``, and log messages that go to both stderr and the event stream.

Used by the shared loop (``training.engine``) and by Hogwild's parent alike.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from training.config import TrainConfig
from training.data.datasets import Dataset
from training.process.runtime import Runtime, all_reduce_sum
from training.protocol import EventWriter, MemoryEntry

log = logging.getLogger(__name__)


def started_fields(
    cfg: TrainConfig, rt: Runtime, data: Dataset, per_epoch: int, start_epoch: int, world: int = 0,
    batch_ranks: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """The ``started`` fields every strategy fills the same way; ``batch_ranks``: the ranks
    with a batch of their own, where not all (tensor-parallel groups share one)."""
    world = world or rt.world_size
    return {
        "strategy": cfg.strategy,
        "world_size": world,
        "device": rt.device_label,
        "dataset": cfg.dataset,
        "dataset_source": data.source,
        "data_path": cfg.data_path,
        "data_mode": data.mode,
        "train_size": len(data.train),
        "test_size": len(data.test),
        "epochs": cfg.epochs,
        "start_epoch": start_epoch,
        "batch_size": cfg.batch_size,
        # Images per optimizer step: --accumulate batches on every rank (or group).
        "global_batch_size": cfg.batch_size * cfg.accumulate * (batch_ranks or world),
        "accumulate": cfg.accumulate,
        "precision": cfg.precision,
        "compile": cfg.compile,
        "steps_per_epoch": per_epoch,
        "total_steps": per_epoch * cfg.epochs,
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "dry_run": cfg.dry_run,
        "torch_version": torch.__version__,
    }


def epoch_emit(
    events: EventWriter,
    rt: Runtime,
    *,
    epoch: int,
    step: int,
    test_loss: float | None,
    test_accuracy: float,
    report: dict[str, Any],
    memory: list[MemoryEntry] | None = None,
) -> None:
    """The ``epoch`` event, and its line in the log (rank 0); ``memory``: what each rank holds
    (``training.observe.memory``)."""
    extra: dict[str, Any] = {} if memory is None else {"memory": memory}
    events.emit(
        "epoch", epoch=epoch, step=step, test_loss=test_loss, test_accuracy=test_accuracy,
        **report, **extra,
    )  # fmt: skip
    if rt.is_main:
        log.info("epoch %d: test loss %s, accuracy %.4f", epoch, test_loss, test_accuracy)


def finished_emit(
    events: EventWriter,
    cfg: TrainConfig,
    test_loss: float | None,
    test_accuracy: float,
    *,
    start_epoch: int,
    step: int,
    t_start: float,
    last_epoch: int | None = None,
) -> None:
    """``last_epoch``: the epoch training ended after, where it stopped early at its target."""
    end = cfg.epochs if last_epoch is None else last_epoch
    events.emit(
        "finished",
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        epochs=cfg.epochs,
        epochs_run=max(0, end - start_epoch + 1),
        steps=step,
        duration=round(time.monotonic() - t_start, 3),
    )


def target_reached(
    events: EventWriter, rt: Runtime, cfg: TrainConfig, *, epoch: int, test_accuracy: float
) -> bool:
    """Whether training ends after this epoch because its test accuracy reached
    --target-accuracy. Rank 0's evaluation decides and every rank learns its answer through one
    tiny all-reduce, so that all ranks leave the loop after the same epoch (a rank that went on
    alone would wait forever in its next collective). Every rank calls this."""
    if cfg.target_accuracy is None:
        return False
    mine = 1.0 if rt.is_main and test_accuracy >= cfg.target_accuracy else 0.0
    if all_reduce_sum(rt, [mine])[0] <= 0:
        return False
    log_to(
        events,
        rt,
        f"Reached the target test accuracy {cfg.target_accuracy:.2%} at epoch {epoch} "
        f"({test_accuracy:.2%}): training ends after epoch {epoch} of {cfg.epochs}.",
    )
    return True


def log_to(events: EventWriter, rt: Runtime, message: str, level: str = "info") -> None:
    """``message`` on stderr (rank 0) and as a ``log`` event."""
    if rt.is_main:
        log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", message)
    events.log(message, level)


def data_source_log(events: EventWriter, rt: Runtime, data: Dataset) -> None:
    """Where the images came from; a warning when they are a substitute for the full set."""
    log_to(events, rt, f"Data: {data.source}.", "warning" if data.substitute else "info")
