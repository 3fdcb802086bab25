"""Hogwild's parent: ``train`` sets up the shared model, data and processes, then drives the
epochs with the engine's driver (``training.epochs``); each epoch it relays the processes' step
reports as step events, writes requested checkpoints, and evaluates the shared model.
"""

from __future__ import annotations

import os
import time
import uuid

import torch
from torch import nn

from training import checkpoint
from training.config import TrainConfig
from training.data.batching import steps_per_epoch
from training.data.datasets import Dataset
from training.data.shared_data import Segment, segment_path, segment_remove
from training.epochs import EpochStart, Ranks, epochs_drive, model_build, started_emit
from training.loop import Tested, evaluate
from training.observe import reporting
from training.observe.meter import report_from_rows
from training.process.run_requests import checkpoint_request_take
from training.process.runtime import Runtime, machine_name
from training.protocol import EventWriter
from training.strategies.hogwild.messages import (
    CheckpointCopy,
    EpochDone,
    ProcessArgs,
    Ready,
    StepReport,
)
from training.strategies.hogwild.processes import Processes
from training.strategies.hogwild.setup import (
    PROCESS_OPTIMIZERS,
    dataset_owned,
    resume_plan,
    shared_tensors,
)


def train(cfg: TrainConfig, rt: Runtime, events: EventWriter) -> None:
    """The parent's side of a Hogwild run (``process.process_main`` is the processes')."""
    t_start = time.monotonic()
    if rt.device.type != "cpu":
        raise RuntimeError("hogwild trains on the CPU (the CLI refuses --gpus for it)")
    built, state = model_build(cfg)
    model = built.model
    # Before spawning: the processes receive handles to these storages, not copies.
    model.share_memory()
    path = segment_path(os.getpid(), f"hogwild-{uuid.uuid4().hex[:12]}-{cfg.dataset}")
    processes = Processes.spawning()
    try:
        data, segment = dataset_owned(cfg, path)
        per_epoch = steps_per_epoch(len(data.train), cfg.batch_size, cfg.nproc, cfg.step_limit)
        resumed, optimizer_states = resume_plan(cfg, state, per_epoch)
        threads = max(1, torch.get_num_threads() // cfg.nproc)
        ready = _processes_start(
            processes, cfg, model, segment, optimizer_states, threads, data.mode
        )
        # Every process has mapped the data: the name can go, the memory stays until all unmap.
        segment_remove(path)
        ranks = Ranks(
            devices=["cpu"] * cfg.nproc,
            pids=[m.pid for m in ready],
            machines=[machine_name()] * len(ready),  # one machine: this process's
            launcher_pid=os.getpid(),
            notes=[_processes_note(cfg, threads), *data.notes, *resumed.notes],
            shared_tensors=shared_tensors(model, data, ready),
            world=cfg.nproc,
        )
        started_emit(
            cfg, rt, events, data=data, built=built, per_epoch=per_epoch,
            start_epoch=resumed.point.start_epoch, ranks=ranks,
        )  # fmt: skip
        # The parent alone evaluates; the processes wait for an epoch that is never sent.
        epochs_drive(
            cfg, rt, events, resume=resumed.point, t_start=t_start,
            epoch_train=lambda work: _epoch_train(
                cfg, rt, events, processes, model, data, work, per_epoch
            ),
            evaluate=lambda: evaluate(model, data, rt, cfg.test_batch_size),
        )  # fmt: skip
        # After the event: the results are in; the processes' exit (seconds of interpreter
        # teardown) is no part of the training time.
        processes.join()
    finally:
        processes.close()
        segment_remove(path)


def _processes_start(
    processes: Processes,
    cfg: TrainConfig,
    model: nn.Module,
    segment: Segment | None,
    optimizer_states: list[dict[str, object] | None],
    threads: int,
    data_mode: str,
) -> list[Ready]:
    """Spawn ``cfg.nproc`` processes over the shared ``model``; their Ready, in rank order."""
    for rank in range(cfg.nproc):
        args = ProcessArgs(
            rank, cfg, segment, optimizer_states[rank], threads, os.getpid(), data_mode
        )
        processes.start(args, model)
    return processes.ready()


def _processes_note(cfg: TrainConfig, threads: int) -> str:
    return (
        f"Hogwild ran {cfg.nproc} process(es), {threads} thread(s) each, updating one "
        f"shared model without locks; each step of each process covers {cfg.batch_size} images."
    )


def _epoch_train(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    processes: Processes,
    model: nn.Module,
    data: Dataset,
    work: EpochStart,
    per_epoch: int,
) -> tuple[int, Tested]:
    """Have the processes train one epoch, then evaluate and checkpoint the shared model while
    they wait; returns (global step, the test figures)."""
    processes.send(work)
    done = _epoch_collect(cfg, events, processes, work)
    step = work.step_base + per_epoch - work.skip
    test_loss, test_accuracy = evaluate(model, data, rt, cfg.test_batch_size)
    reporting.epoch_emit(
        events, rt, epoch=work.epoch, step=step, test_loss=test_loss,
        test_accuracy=test_accuracy, report=report_from_rows([d.row for d in done]),
        memory=[d.memory for d in done if d.memory is not None],
    )  # fmt: skip
    if cfg.checkpoint_dir:
        # Process 0's optimizer is the one other strategies resume; Hogwild takes each.
        # It answers a request process 0 had no step left for.
        asked = checkpoint_request_take() or processes.wanted.is_set()
        processes.wanted.clear()
        checkpoint.checkpoint_write(
            cfg, events, model_state=model.state_dict(), optimizer_state=done[0].optimizer_state,
            epoch=work.epoch, step=step,
            extra={PROCESS_OPTIMIZERS: [d.optimizer_state for d in done]}, answers_request=asked,
        )  # fmt: skip
    return step, (test_loss, test_accuracy)


def _epoch_collect(
    cfg: TrainConfig, events: EventWriter, processes: Processes, work: EpochStart
) -> list[EpochDone]:
    """Relay the processes' step reports as step events, and requested checkpoints, until every
    process has finished the epoch; returns their EpochDone messages in rank order."""
    nproc = len(processes.processes)
    steps = StepRows(nproc)
    done: dict[int, EpochDone] = {}
    while len(done) < nproc:
        # No deadline: reports come every --log-interval steps, which may take long; a process
        # that dies is noticed at once, and SIGTERM ends a run that hangs.
        message = processes.receive(None)
        if checkpoint_request_take():
            if cfg.checkpoint_dir:
                processes.wanted.set()
            else:
                checkpoint.checkpoint_request_refuse(events, step=work.step_base)
        if isinstance(message, CheckpointCopy):
            # Process 0's model and optimizer at its step `local`; the other processes are a few
            # steps either side, as anything read from a Hogwild model is.
            checkpoint.checkpoint_write(
                cfg, events, model_state=message.model_state,
                optimizer_state=message.optimizer_state, epoch=work.epoch,
                step=work.step_base + message.local,
                images_into_epoch=(work.skip + message.local) * cfg.batch_size * nproc,
            )  # fmt: skip
        elif isinstance(message, StepReport):
            for local, rows in steps.add(message):
                report = report_from_rows(rows)
                # Every process's optimizer keeps the configured rate (no schedule).
                events.emit(
                    "step", epoch=work.epoch, step=work.step_base + local, lr=cfg.lr, **report
                )
        elif isinstance(message, EpochDone):
            done[message.rank] = message
        else:
            raise RuntimeError(f"unexpected message from a Hogwild process: {message}")
    return [done[r] for r in range(nproc)]


class StepRows:
    """The processes' step reports, merged into one row per step for every process.

    Processes report at the same local steps, each in order: a step is complete when the
    slowest process has reported it, and steps complete in order.
    """

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self._pending: dict[int, dict[int, list[float]]] = {}

    def add(self, report: StepReport) -> list[tuple[int, list[list[float]]]]:
        """The steps ``report`` completes: (local step, every process's row in rank order)."""
        self._pending.setdefault(report.local, {})[report.rank] = report.row
        complete = []
        while self._pending and len(self._pending[min(self._pending)]) == self.nproc:
            local = min(self._pending)
            rows = self._pending.pop(local)
            complete.append((local, [rows[r] for r in range(self.nproc)]))
        return complete
