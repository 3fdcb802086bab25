"""The training loop shared by every strategy (Hogwild's workers run it in each process)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training import checkpoint
from training.batching import rank_batches, steps_per_epoch
from training.config import TrainConfig
from training.data import Dataset, Split, load_dataset, to_batch
from training.meter import StepTiming, Window, finite, window_report
from training.model import SimpleCNN
from training.protocol import EventWriter
from training.run_requests import checkpoint_request_pending, checkpoint_request_take
from training.runtime import Runtime, all_gather, all_reduce_sum
from training.strategies import Plan, plan_build
from training.strategies.common import StepFn

log = logging.getLogger(__name__)


def train(cfg: TrainConfig, rt: Runtime, events: EventWriter) -> None:
    if cfg.strategy == "hogwild":
        from training.strategies.hogwild import train as hogwild_train

        hogwild_train(cfg, rt, events)
        return
    t_start = time.monotonic()
    # Same seed on every rank: identical initial weights (DDP also broadcasts rank 0's).
    torch.manual_seed(cfg.seed)
    model = SimpleCNN()
    # Before the data: a bad --resume fails before seconds are spent loading it.
    state = checkpoint.load_for(cfg) if cfg.resume else None
    if state is not None:
        model.load_state_dict(state["model"])
    data, shared_tensors = dataset_for(cfg, rt)
    plan = plan_build(cfg, rt, model)
    per_epoch = steps_per_epoch(len(data.train), cfg.batch_size, rt.world_size, cfg.step_limit)
    resume = ResumePoint()
    if state is not None:
        resume = resume_apply(
            cfg,
            state,
            plan.optimizer,
            plan.notes,
            takes_optimizer=plan.saves_optimizer,
            restore=plan.optimizer_restore,
            global_batch=cfg.batch_size * rt.world_size,
            per_epoch=per_epoch,
        )
    start_epoch, step = resume.start_epoch, resume.step

    ranks = all_gather(rt, (os.getpid(), rt.device_label))
    events.emit(
        "started",
        **started_fields(cfg, rt, data, per_epoch, start_epoch),
        devices=plan.devices or [label for _, label in ranks],
        pids=[pid for pid, _ in ranks],
        # Under torchrun the ranks' parent is the launcher, the process the caller started.
        launcher_pid=os.getppid() if rt.distributed else os.getpid(),
        requests_pid=os.getpid(),
        notes=plan.notes,
        shared_tensors=shared_tensors,
        **plan.started,
    )
    log_to(events, rt, f"Data: {data.source}.", "warning" if data.substitute else "info")
    for message in plan.warnings:
        log_to(events, rt, message, "warning")
    if start_epoch > cfg.epochs:
        log_to(
            events, rt, f"The checkpoint already covers {cfg.epochs} epoch(s); nothing to train."
        )

    test_loss, test_accuracy = None, 0.0
    for epoch in range(start_epoch, cfg.epochs + 1):
        batches = rank_batches(
            len(data.train), cfg.batch_size, rt.world_size, rt.rank, cfg.seed, epoch
        )[:per_epoch]
        done_before = resume.skip_batches if epoch == start_epoch else 0
        plan.net.train()
        step, whole = epoch_run(
            cfg, rt, events, plan, data, batches[done_before:], epoch, step, done_before
        )
        report = window_report(rt, whole)
        test_loss, test_accuracy = evaluate(
            plan.eval_net, data, rt, cfg.test_batch_size, plan.input_device, plan.output_device
        )
        events.emit(
            "epoch",
            epoch=epoch,
            step=step,
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            **report,
        )
        if rt.is_main:
            log.info("epoch %d: test loss %s, accuracy %.4f", epoch, test_loss, test_accuracy)
        if cfg.checkpoint_dir:
            optimizer_state = optimizer_state_of(plan, rt)  # every rank: ZeRO gathers
            if rt.is_main:
                checkpoint_write(
                    cfg, events, model_state=plan.model.state_dict(),
                    optimizer_state=optimizer_state, epoch=epoch, step=step,
                    # It answers a request made during the epoch's last step or evaluation.
                    answers_request=checkpoint_request_take(),
                )  # fmt: skip
    if start_epoch > cfg.epochs:
        test_loss, test_accuracy = evaluate(
            plan.eval_net, data, rt, cfg.test_batch_size, plan.input_device, plan.output_device
        )
    finished_emit(
        events, cfg, test_loss, test_accuracy, start_epoch=start_epoch, step=step, t_start=t_start
    )


def optimizer_state_of(plan: Plan, rt: Runtime) -> dict[str, Any] | None:
    """The optimizer state a checkpoint holds, on rank 0. Every rank calls this: where the
    state is partitioned (ZeRO), gathering it is a collective."""
    if plan.optimizer_gather is not None:
        return plan.optimizer_gather()
    return plan.optimizer.state_dict() if plan.saves_optimizer and rt.is_main else None


def checkpoint_asked(plan: Plan, rt: Runtime) -> bool:
    """Whether a checkpoint is requested; where writing one is a collective, all ranks learn
    rank 0's answer (one tiny all-reduce a step, for those strategies only)."""
    pending = rt.is_main and checkpoint_request_pending()
    if plan.optimizer_gather is None:
        return pending
    return all_reduce_sum(rt, [1.0 if pending else 0.0])[0] > 0


def finished_emit(
    events: EventWriter,
    cfg: TrainConfig,
    test_loss: float | None,
    test_accuracy: float | None,
    *,
    start_epoch: int,
    step: int,
    t_start: float,
) -> None:
    events.emit(
        "finished",
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        epochs=cfg.epochs,
        epochs_run=max(0, cfg.epochs - start_epoch + 1),
        steps=step,
        duration=round(time.monotonic() - t_start, 3),
    )


def epoch_run(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    plan: Plan,
    data: Dataset,
    batches: Sequence[torch.Tensor],
    epoch: int,
    step: int,
    done_before: int = 0,
) -> tuple[int, Window]:
    """Train on ``batches`` (the epoch's, after the ``done_before`` a resumed run had done),
    emitting step events and writing requested checkpoints; returns (global step, the epoch's
    window)."""
    # On the output device: that is where the loss is (model-parallel: the last stage's).
    interval, whole = Window(plan.output_device), Window(plan.output_device)
    timings = steps_run(plan.step, data, batches, plan.input_device, plan.output_device)
    for i, timing in enumerate(timings):
        step += 1
        interval.add(timing)
        whole.add(timing)
        last = i == len(batches) - 1
        # Step 1 too (as pytorch/examples logs batch 0): the first point shows without waiting.
        if step % cfg.log_interval == 0 or step == 1 or last:
            # Every rank takes this branch at the same step: the all-gather inside matches up.
            events.emit("step", epoch=epoch, step=step, **window_report(rt, interval))
            interval = Window(plan.output_device)
        # Rank 0 writes: its replica is every rank's. At the epoch's last step the request
        # waits for the epoch's own checkpoint, a few seconds later.
        if not checkpoint_asked(plan, rt):
            continue
        if cfg.checkpoint_dir is None:
            if rt.is_main:
                checkpoint_request_take()
                checkpoint_request_refuse(events, step=step)
        elif not last:
            optimizer_state = optimizer_state_of(plan, rt)
            if rt.is_main:
                checkpoint_request_take()
                trained = (done_before + i + 1) * cfg.batch_size * rt.world_size
                checkpoint_write(
                    cfg, events, model_state=plan.model.state_dict(),
                    optimizer_state=optimizer_state, epoch=epoch, step=step,
                    images_into_epoch=trained,
                )  # fmt: skip
    return step, whole


def steps_run(
    step: StepFn,
    data: Dataset,
    batches: Sequence[torch.Tensor],
    input_device: torch.device,
    label_device: torch.device | None = None,
) -> Iterator[StepTiming]:
    """One optimizer step per batch of indices into ``data.train``, timed: the loop every
    strategy runs (Hogwild's workers too), public so that tests drive it as the engine does."""
    clock = time.perf_counter
    for idx in batches:
        t0 = clock()
        x, y = to_batch(data.train, idx, input_device, data.mean, data.std, label_device)
        t1 = clock()
        loss = step(x, y)
        t2 = clock()
        yield StepTiming(loss, len(idx), t1 - t0, t2 - t1)


@torch.no_grad()
def evaluate(
    net: nn.Module,
    data: Dataset,
    rt: Runtime,
    batch_size: int,
    input_device: torch.device | None = None,
    label_device: torch.device | None = None,
) -> tuple[float | None, float]:
    """Test loss (mean per image) and accuracy over the whole test split.

    Each rank takes every world_size-th image, with no padding, and the sums are reduced, so
    the figures are exact for any number of ranks.
    """
    input_device = rt.device if input_device is None else input_device
    label_device = input_device if label_device is None else label_device
    net.eval()
    test: Split = data.test
    mine = torch.arange(rt.rank, len(test), rt.world_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=label_device)
    correct = torch.zeros((), dtype=torch.int64, device=label_device)
    for idx in mine.split(batch_size):
        x, y = to_batch(test, idx, input_device, data.mean, data.std, label_device)
        logits = net(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").to(torch.float64)
        correct += (logits.argmax(dim=1) == y).sum()
    total_loss, total_correct, total = all_reduce_sum(
        rt, [float(loss_sum.item()), float(correct.item()), float(len(mine))]
    )
    return finite(total_loss / total), round(total_correct / total, 6)


def dataset_for(cfg: TrainConfig, rt: Runtime) -> tuple[Dataset, list[dict[str, Any]]]:
    """The run's data and ``started.shared_tensors``: under torchrun one shared copy per
    machine, else this process's own (nothing to share with)."""
    if rt.distributed:
        from training.shared_data import dataset_for_ranks

        return dataset_for_ranks(cfg.dataset, Path(cfg.data_dir), rt)
    return load_dataset(cfg.dataset, Path(cfg.data_dir)), []


def started_fields(
    cfg: TrainConfig, rt: Runtime, data: Dataset, per_epoch: int, start_epoch: int, world: int = 0
) -> dict[str, Any]:
    """The ``started`` fields every strategy fills the same way."""
    world = world or rt.world_size
    return {
        "strategy": cfg.strategy,
        "world_size": world,
        "device": rt.device_label,
        "dataset": cfg.dataset,
        "dataset_source": data.source,
        "train_size": len(data.train),
        "test_size": len(data.test),
        "epochs": cfg.epochs,
        "start_epoch": start_epoch,
        "batch_size": cfg.batch_size,
        "global_batch_size": cfg.batch_size * world,
        "steps_per_epoch": per_epoch,
        "total_steps": per_epoch * cfg.epochs,
        "optimizer": cfg.optimizer,
        "lr": cfg.lr,
        "seed": cfg.seed,
        "dry_run": cfg.dry_run,
        "torch_version": torch.__version__,
    }


@dataclass(frozen=True)
class ResumePoint:
    start_epoch: int = 1  # the first epoch to train
    step: int = 0  # global optimizer steps already taken
    skip_batches: int = 0  # batches of start_epoch already trained (a mid-epoch checkpoint)


def resume_apply(
    cfg: TrainConfig,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    notes: list[str],
    takes_optimizer: bool = True,
    *,
    restore: Callable[[dict[str, Any]], str] | None = None,
    global_batch: int,
    per_epoch: int,
) -> ResumePoint:
    """Load the optimizer state and RNG states of a checkpoint whose model is already loaded;
    returns where training continues and notes what was resumed.

    ``optimizer`` None with ``takes_optimizer``: the caller hands the state on itself (Hogwild's
    workers); ``restore``: the strategy takes it its own way (ZeRO, partitioned);
    ``takes_optimizer`` False: it cannot take a plain optimizer's state.
    """
    saved_optimizer = state.get("optimizer")
    if saved_optimizer is None:
        notes.append("The checkpoint holds no optimizer state; the optimizer starts afresh.")
    elif restore is not None:
        notes.append(restore(saved_optimizer))
    elif not takes_optimizer or not checkpoint.holds_torch_optimizer(state):
        notes.append(
            "This strategy does not take the checkpoint's optimizer state; the optimizer "
            "starts afresh."
        )
    elif optimizer is not None:
        optimizer.load_state_dict(saved_optimizer)
        # The saved learning rate would silently override --lr.
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr
    checkpoint.restore_rng(state)
    epoch, step = int(state["epoch"]), int(state["step"])
    point = ResumePoint(epoch + 1, step)
    trained = state.get("images_into_epoch")
    if trained is not None:
        # The epoch's image order is seeded, so skipping the images trained is exact when the
        # global batch is the one the checkpoint was written with.
        skip, rest = divmod(int(trained), global_batch)
        if skip < per_epoch:
            point = ResumePoint(epoch, step, skip)
        if rest:
            notes.append(
                f"The checkpoint was written {trained} images into epoch {epoch}, not a whole "
                f"number of this run's global batches of {global_batch}: {rest} of them are "
                "trained again."
            )
    where = f"epoch {epoch}, step {step}" + (
        f" ({trained} images into the epoch)" if trained is not None else ""
    )
    notes.append(
        f"Resumed from {cfg.resume} at {where}; training continues with epoch "
        f"{point.start_epoch}"
        + (f" from its batch {point.skip_batches + 1}." if point.skip_batches else ".")
    )
    return point


def checkpoint_write(
    cfg: TrainConfig,
    events: EventWriter,
    *,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any] | None,
    epoch: int,
    step: int,
    extra: dict[str, Any] | None = None,
    answers_request: bool = False,
    images_into_epoch: int | None = None,
) -> Path:
    """Write a checkpoint, apply the retention of its kind, then report it: the epoch's own
    (``--keep-checkpoints``), or, with ``images_into_epoch``, one written mid-epoch because
    someone asked (``--keep-requested-checkpoints``)."""
    assert cfg.checkpoint_dir is not None
    directory = Path(cfg.checkpoint_dir)
    path = checkpoint.save(
        directory,
        model_state=model_state,
        optimizer_state=optimizer_state,
        epoch=epoch,
        step=step,
        config=cfg.to_dict(),
        images_into_epoch=images_into_epoch,
        extra=extra,
    )
    requested = images_into_epoch is not None
    kind, keep, flag = (
        ("step", cfg.keep_requested_checkpoints, "--keep-requested-checkpoints")
        if requested
        else ("epoch", cfg.keep_checkpoints, "--keep-checkpoints")
    )
    # Before the event: whoever reads it can then list exactly the files that are left.
    for old in checkpoint.retention_apply(directory, keep, kind=kind):
        log.info("deleted %s (%s %d)", old, flag, keep)
    events.emit(
        "checkpoint",
        epoch=epoch,
        step=step,
        path=str(path),
        requested=requested,
        answers_request=answers_request or requested,
    )
    return path


def checkpoint_request_refuse(events: EventWriter, *, step: int) -> None:
    events.log(
        f"A checkpoint was requested at step {step}, but this run writes none: start it with "
        "--checkpoint-dir.",
        "warning",
    )


def log_to(events: EventWriter, rt: Runtime, message: str, level: str = "info") -> None:
    if rt.is_main:
        log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", message)
    events.log(message, level)
