"""The loop each Hogwild process runs: train this rank's shard of every epoch the parent starts.

It imports nothing of the parent's side; the parent's ``processes`` module imports it (as
mnist_hogwild's ``main.py`` imports ``train.py``).
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training import checkpoint
from training.data.batching import rank_batches, steps_per_epoch
from training.data.datasets import Dataset
from training.data.shared_data import segment_attach, shared_flags
from training.data.sources import dataset_open
from training.epochs import EpochStart
from training.loop import StepFn, steps_run
from training.observe.memory import memory_entry
from training.observe.meter import Window
from training.process.allocator import allocator_tune
from training.process.lifeline import parent_death_signal_set
from training.strategies.common import optimizer_make, step_default
from training.strategies.hogwild.messages import (
    CheckpointCopy,
    EpochDone,
    ProcessArgs,
    ProcessFailed,
    Ready,
    StepReport,
)

_CPU = torch.device("cpu")


def process_main(
    args: ProcessArgs, model: nn.Module, results: Any, control: Any, wanted: Any
) -> None:
    """One Hogwild process: train on this rank's shard each epoch the parent starts."""
    _process_setup(args)
    cfg = args.cfg
    try:
        data = (
            segment_attach(args.segment)
            if args.segment is not None
            else dataset_open(
                cfg.dataset, Path(cfg.data_dir), cfg.data_path, workers=0, mode=args.data_mode
            )
        )
        optimizer = optimizer_make(cfg, model)
        if args.optimizer_state is not None:
            checkpoint.optimizer_state_load(optimizer, args.optimizer_state, lr=cfg.lr)
        params_shared = [p.is_shared() for p in model.parameters()]
        results.put(Ready(args.rank, os.getpid(), shared_flags(data), params_shared))
        step_fn = step_default(model, optimizer)
        # Process 0 answers checkpoint requests.
        answers = wanted if args.rank == 0 else None
        while isinstance(work := control.get(), EpochStart):
            whole = _process_epoch(
                args, work, model=model, optimizer=optimizer, step_fn=step_fn, data=data,
                results=results, answers=answers,
            )  # fmt: skip
            # A copy: pickling would otherwise move the live state into shared memory, and the
            # parent would write a checkpoint of tensors this process goes on changing.
            state = copy.deepcopy(optimizer.state_dict()) if cfg.checkpoint_dir else None
            held = memory_entry(
                rank=args.rank, parameters=model.parameters(), optimizer=optimizer, device=_CPU
            )
            results.put(EpochDone(args.rank, work.epoch, whole.row(), state, held))
    except BaseException:
        with contextlib.suppress(Exception):
            results.put(ProcessFailed(args.rank, traceback.format_exc()))
        raise


def _process_setup(args: ProcessArgs) -> None:
    """What a spawned process sets before it trains: it dies with the parent, and leaves
    signals meant for the run to the parent."""
    parent_death_signal_set()
    # The parent may have died before prctl took effect.
    if os.getppid() != args.parent_pid:
        os._exit(1)
    allocator_tune()  # a spawned interpreter: the parent's setting is not inherited
    # Ctrl-C reaches the whole process group; the parent decides, and stops the processes. The
    # parent takes checkpoint requests too: one sent to the group must not kill a process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    torch.set_num_threads(args.threads)


def _process_epoch(
    args: ProcessArgs,
    work: EpochStart,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step_fn: StepFn,
    data: Dataset,
    results: Any,
    answers: Any | None,
) -> Window:
    """Train this process's shard of ``work.epoch``, reporting steps (and, where ``answers`` is
    the request flag, requested checkpoints) to the parent; returns the epoch's window."""
    cfg = args.cfg
    per_epoch = steps_per_epoch(len(data.train), cfg.batch_size, cfg.nproc, cfg.step_limit)
    batches = rank_batches(
        len(data.train), cfg.batch_size, cfg.nproc, args.rank, cfg.seed, work.epoch
    )[:per_epoch][work.skip :]
    model.train()
    interval, whole = Window(_CPU), Window(_CPU)
    for i, timing in enumerate(steps_run(step_fn, data, batches, _CPU)):
        interval.add(timing)
        whole.add(timing)
        local = i + 1
        last = i == len(batches) - 1
        if (work.step_base + local) % cfg.log_interval == 0 or last:
            results.put(StepReport(args.rank, work.epoch, local, interval.row()))
            interval = Window(_CPU)
        # At the epoch's last step the parent's epoch checkpoint answers instead.
        if answers is not None and not last and answers.is_set():
            answers.clear()
            results.put(CheckpointCopy(args.rank, local, *_checkpoint_copy(model, optimizer)))
    return whole


def _checkpoint_copy(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Copies of this process's model and optimizer state, as of its last step: sent as they
    are, they would move into shared memory and go on changing."""
    model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model_state, copy.deepcopy(optimizer.state_dict())
