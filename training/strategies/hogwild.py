"""``hogwild``: N processes update one model in shared memory, asynchronously, without locks.

As pytorch/examples' mnist_hogwild: the parent builds the model and moves its parameters into
shared memory (``model.share_memory()``); each worker process builds its own optimizer over
those same parameters and trains on its own shard of every global batch (``rank_batches``),
writing its updates straight into the shared parameters while the others do the same. Nothing
synchronises the steps; the parent synchronises the epochs only, to evaluate the shared model
and write the checkpoint while the workers wait.

The parent does not train: it is rank 0 of the protocol (it writes every event), collects the
workers' step reports from a queue, and is the process the caller holds. The dataset is one
shared copy too (``training.shared_data``): the parent creates it, the workers map it.

Workers are started with the ``spawn`` method, not ``fork``: a forked child cannot use CUDA
once the parent has (pytorch#40403), and forking after the parent's OpenMP thread pool has run
can hang the child in libgomp. Spawn costs one interpreter start and torch import per worker,
about two seconds, once per run. The workers die with the parent: SIGTERM to the parent ends
them in its ``finally``, and a parent killed outright takes them along through
``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import queue
import signal
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

from training import checkpoint, reporting
from training.allocator import allocator_tune
from training.batching import rank_batches, steps_per_epoch
from training.checkpoint import Resumed, ResumePoint
from training.config import TrainConfig
from training.data import Dataset, load_dataset
from training.loop import StepFn, Tested, evaluate, steps_run
from training.meter import Window, report_from_rows
from training.model import SimpleCNN
from training.processes import parent_death_signal_set
from training.protocol import EventWriter, SharedTensor
from training.run_requests import checkpoint_request_take
from training.runtime import Runtime, machine_name
from training.shared_data import (
    Segment,
    segment_attach,
    segment_create,
    segment_path,
    segment_remove,
    shared_flags,
    shared_tensors_report,
    stale_segments_remove,
    tensor_entry,
)
from training.strategies.common import optimizer_make, step_default

log = logging.getLogger(__name__)

WORKER_OPTIMIZERS = "worker_optimizers"  # a checkpoint's per-worker optimizer states
START_TIMEOUT_S = 300.0  # spawning imports torch in each worker; slow disks, many workers
STOP_TIMEOUT_S = 30.0
_CPU = torch.device("cpu")


# --- messages between the parent and its workers ----------------------------------------------
# Module-level and picklable: spawn pickles them through the queues. Tensors inside travel as
# handles to shared memory (torch.multiprocessing's pickler), as they would in a tuple.


@dataclass(frozen=True)
class WorkerArgs:
    """What a worker is started with."""

    rank: int
    cfg: TrainConfig
    segment: Segment | None  # None: no shared copy could be made, load privately
    optimizer_state: dict[str, Any] | None
    threads: int
    parent_pid: int


@dataclass(frozen=True)
class EpochStart:
    """Parent to worker: train this epoch."""

    epoch: int
    step_base: int  # global steps taken before it
    skip: int  # its batches a resumed run had trained already


@dataclass(frozen=True)
class Stop:
    """Parent to worker: the run is over, exit."""


@dataclass(frozen=True)
class Ready:
    """Worker to parent: started, data mapped, optimizer built."""

    rank: int
    pid: int
    data_shared: list[bool]  # shared_flags(data): which dataset tensors it maps shared
    params_shared: list[bool]  # is_shared() of each model parameter, as it sees them


@dataclass(frozen=True)
class StepReport:
    """Worker to parent: its meter row for the steps since its last report."""

    rank: int
    epoch: int
    local: int  # the worker's step within this epoch's run, 1-based
    row: list[float]  # Window.row()


@dataclass(frozen=True)
class CheckpointCopy:
    """Worker 0 to parent: its model and optimizer as of its step ``local``, on request."""

    rank: int
    local: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]


@dataclass(frozen=True)
class EpochDone:
    """Worker to parent: finished the epoch."""

    rank: int
    epoch: int
    row: list[float]  # the whole epoch's Window.row()
    optimizer_state: dict[str, Any] | None  # a copy, where the run writes checkpoints


@dataclass(frozen=True)
class WorkerFailed:
    rank: int
    traceback: str


WorkerMessage = Ready | StepReport | CheckpointCopy | EpochDone | WorkerFailed


# --- in the parent ----------------------------------------------------------------------------


def train(cfg: TrainConfig, rt: Runtime, events: EventWriter) -> None:
    """The parent's side of a Hogwild run (``worker_main`` is the workers')."""
    t_start = time.monotonic()
    if rt.device.type != "cpu":
        raise RuntimeError("hogwild trains on the CPU (the CLI refuses --gpus for it)")
    model, state = _model_shared(cfg)
    path = segment_path(os.getpid(), f"hogwild-{uuid.uuid4().hex[:12]}-{cfg.dataset}")
    workers = _Workers.spawning()
    try:
        data, segment = _dataset_owned(cfg, path)
        per_epoch = steps_per_epoch(len(data.train), cfg.batch_size, cfg.nproc, cfg.step_limit)
        resumed, optimizer_states = _resume(cfg, state, per_epoch)
        threads = max(1, torch.get_num_threads() // cfg.nproc)
        for rank in range(cfg.nproc):
            args = WorkerArgs(rank, cfg, segment, optimizer_states[rank], threads, os.getpid())
            workers.start(args, model)
        ready = workers.ready()
        # Every worker has mapped the data: the name can go, the memory stays until all unmap.
        segment_remove(path)
        notes = [_workers_note(cfg, threads), *resumed.notes]
        start = resumed.point.start_epoch
        _started_emit(cfg, rt, events, model, data, ready, per_epoch, start, notes)
        step = resumed.point.step
        tested: Tested = (None, 0.0)
        last = cfg.epochs
        for epoch in range(start, cfg.epochs + 1):
            skip = resumed.point.skip_batches if epoch == start else 0
            work = EpochStart(epoch, step, skip)
            step, tested = _epoch_train(cfg, rt, events, workers, model, data, work, per_epoch)
            # The parent alone evaluates; the workers wait for an epoch that is never sent.
            if reporting.target_reached(events, rt, cfg, epoch=epoch, test_accuracy=tested[1]):
                last = epoch
                break
        if start > cfg.epochs:
            tested = evaluate(model, data, rt, cfg.test_batch_size)
        reporting.finished_emit(
            events, cfg, *tested, start_epoch=start, step=step, t_start=t_start, last_epoch=last
        )
        # After the event: the results are in; the workers' exit (seconds of interpreter
        # teardown) is no part of the training time.
        workers.join()
    finally:
        workers.close()
        segment_remove(path)


def _model_shared(cfg: TrainConfig) -> tuple[nn.Module, dict[str, Any] | None]:
    """The model, from the checkpoint when resuming, in shared memory; and the checkpoint."""
    torch.manual_seed(cfg.seed)
    model = SimpleCNN()
    state = checkpoint.load_for(cfg) if cfg.resume else None
    if state is not None:
        model.load_state_dict(state["model"])
    # Before spawning: the workers receive handles to these storages, not copies.
    model.share_memory()
    return model, state


def _workers_note(cfg: TrainConfig, threads: int) -> str:
    return (
        f"Hogwild ran {cfg.nproc} worker process(es), {threads} thread(s) each, updating one "
        f"shared model without locks; each step of each worker covers {cfg.batch_size} images."
    )


def _resume(
    cfg: TrainConfig, state: dict[str, Any] | None, per_epoch: int
) -> tuple[Resumed, list[dict[str, Any] | None]]:
    """Where training continues, with its notes, and the optimizer state of each worker."""
    if state is None:
        return Resumed(ResumePoint(), ()), [None] * cfg.nproc
    # The workers build their optimizers; each loads the checkpoint's state.
    resumed = checkpoint.resume_apply(
        cfg, state, optimizer=None, global_batch=cfg.batch_size * cfg.nproc, per_epoch=per_epoch
    )
    optimizer_states, notes = workers_optimizer_states(state, cfg.nproc)
    return Resumed(resumed.point, (*resumed.notes, *notes)), optimizer_states


def workers_optimizer_states(
    state: dict[str, Any], nproc: int
) -> tuple[list[dict[str, Any] | None], list[str]]:
    """The optimizer state each worker starts from: its own where the checkpoint has one per
    worker for as many workers, else worker 0's (or a single process's) for all; and a note
    that says which."""
    if not checkpoint.holds_torch_optimizer(state):
        return [None] * nproc, []
    own = state.get(WORKER_OPTIMIZERS)
    if isinstance(own, list) and len(own) == nproc and all(isinstance(o, dict) for o in own):
        note = f"Each of the {nproc} workers resumed its own optimizer state."
        return list(own), [note] if nproc > 1 else []
    note = (
        "The checkpoint holds one optimizer state (a requested checkpoint keeps worker 0's, "
        "another strategy's its only one, or another number of workers); every worker "
        "starts from it."
    )
    return [state["optimizer"]] * nproc, [note] if nproc > 1 else []


def _dataset_owned(cfg: TrainConfig, path: Path) -> tuple[Dataset, Segment | None]:
    stale_segments_remove()
    try:
        return segment_create(cfg.dataset, Path(cfg.data_dir), path)
    except OSError as exc:
        segment_remove(path)
        log.warning("no shared copy of the dataset (%s); each worker loads its own", exc)
        return load_dataset(cfg.dataset, Path(cfg.data_dir)), None


def _started_emit(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    model: nn.Module,
    data: Dataset,
    ready: list[Ready],
    per_epoch: int,
    start_epoch: int,
    notes: list[str],
) -> None:
    events.emit(
        "started",
        **reporting.started_fields(cfg, rt, data, per_epoch, start_epoch, world=cfg.nproc),
        devices=["cpu"] * cfg.nproc,
        pids=[m.pid for m in ready],
        machines=[machine_name()] * len(ready),  # one machine: workers share this process's
        launcher_pid=os.getpid(),
        requests_pid=os.getpid(),
        notes=notes,
        shared_tensors=_shared_tensors(model, data, ready),
    )
    reporting.data_source_log(events, rt, data)
    if start_epoch > cfg.epochs:
        reporting.log_to(events, rt, f"The checkpoint already covers {cfg.epochs} epoch(s).")


def _shared_tensors(model: nn.Module, data: Dataset, ready: list[Ready]) -> list[SharedTensor]:
    """``started.shared_tensors``: shared where the parent and every worker see it shared."""
    data_flags = [
        all(flags)
        for flags in zip(shared_flags(data), *(m.data_shared for m in ready), strict=True)
    ]
    shared = shared_tensors_report(data, data_flags)
    for i, (name, param) in enumerate(model.named_parameters()):
        everywhere = param.is_shared() and all(m.params_shared[i] for m in ready)
        shared.append(tensor_entry(f"model.{name}", param, everywhere))
    return shared


def _epoch_train(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    workers: _Workers,
    model: nn.Module,
    data: Dataset,
    work: EpochStart,
    per_epoch: int,
) -> tuple[int, Tested]:
    """Have the workers train one epoch, then evaluate and checkpoint the shared model while
    they wait; returns (global step, the test figures)."""
    workers.send(work)
    done = _epoch_collect(cfg, events, workers, work)
    step = work.step_base + per_epoch - work.skip
    test_loss, test_accuracy = evaluate(model, data, rt, cfg.test_batch_size)
    reporting.epoch_emit(
        events, rt, epoch=work.epoch, step=step, test_loss=test_loss,
        test_accuracy=test_accuracy, report=report_from_rows([d.row for d in done]),
    )  # fmt: skip
    if cfg.checkpoint_dir:
        # Worker 0's optimizer is the one other strategies resume; Hogwild takes each.
        # It answers a request worker 0 had no step left for.
        asked = checkpoint_request_take() or workers.wanted.is_set()
        workers.wanted.clear()
        checkpoint.checkpoint_write(
            cfg, events, model_state=model.state_dict(), optimizer_state=done[0].optimizer_state,
            epoch=work.epoch, step=step,
            extra={WORKER_OPTIMIZERS: [d.optimizer_state for d in done]}, answers_request=asked,
        )  # fmt: skip
    return step, (test_loss, test_accuracy)


def _epoch_collect(
    cfg: TrainConfig, events: EventWriter, workers: _Workers, work: EpochStart
) -> list[EpochDone]:
    """Relay the workers' step reports as step events, and requested checkpoints, until every
    worker has finished the epoch; returns their EpochDone messages in rank order."""
    nproc = len(workers.processes)
    steps = _StepRows(nproc)
    done: dict[int, EpochDone] = {}
    while len(done) < nproc:
        # No deadline: reports come every --log-interval steps, which may take long; a worker
        # that dies is noticed at once, and SIGTERM ends a run that hangs.
        message = workers.receive(None)
        if checkpoint_request_take():
            if cfg.checkpoint_dir:
                workers.wanted.set()
            else:
                checkpoint.checkpoint_request_refuse(events, step=work.step_base)
        if isinstance(message, CheckpointCopy):
            # Worker 0's model and optimizer at its step `local`; the other workers are a few
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
                # Every worker's optimizer keeps the configured rate (no schedule).
                events.emit(
                    "step", epoch=work.epoch, step=work.step_base + local, lr=cfg.lr, **report
                )
        elif isinstance(message, EpochDone):
            done[message.rank] = message
        else:
            raise RuntimeError(f"unexpected message from a Hogwild worker: {message}")
    return [done[r] for r in range(nproc)]


class _StepRows:
    """The workers' step reports, merged into one row per step for every worker.

    Workers report at the same local steps, each in order: a step is complete when the
    slowest worker has reported it, and steps complete in order.
    """

    def __init__(self, nproc: int) -> None:
        self.nproc = nproc
        self._pending: dict[int, dict[int, list[float]]] = {}

    def add(self, report: StepReport) -> list[tuple[int, list[list[float]]]]:
        """The steps ``report`` completes: (local step, every worker's row in rank order)."""
        self._pending.setdefault(report.local, {})[report.rank] = report.row
        complete = []
        while self._pending and len(self._pending[min(self._pending)]) == self.nproc:
            local = min(self._pending)
            rows = self._pending.pop(local)
            complete.append((local, [rows[r] for r in range(self.nproc)]))
        return complete


@dataclass
class _Workers:
    """The parent's side of the worker processes: their queues and the request flag."""

    ctx: Any  # the spawn context
    results: Any  # one queue, every worker to the parent
    # Set by the parent when a checkpoint is requested; worker 0 answers with its state.
    wanted: Any
    processes: list[Any] = field(default_factory=list)
    controls: list[Any] = field(default_factory=list)  # one queue each, parent to worker

    @classmethod
    def spawning(cls) -> _Workers:
        ctx = mp.get_context("spawn")
        return cls(ctx, ctx.Queue(), ctx.Event())

    def start(self, args: WorkerArgs, model: nn.Module) -> None:
        control = self.ctx.SimpleQueue()
        process = self.ctx.Process(
            target=worker_main,
            args=(args, model, self.results, control, self.wanted),
            name=f"trainyard-hogwild-{args.rank}",
            daemon=True,
        )
        _start_with_requests_blocked(process)
        self.processes.append(process)
        self.controls.append(control)

    def ready(self) -> list[Ready]:
        """Every worker's Ready, in rank order."""
        ready = []
        for _ in self.processes:
            message = self.receive(START_TIMEOUT_S)
            if not isinstance(message, Ready):
                raise RuntimeError(f"expected Ready from a Hogwild worker, got {message}")
            ready.append(message)
        return sorted(ready, key=lambda m: m.rank)

    def send(self, command: EpochStart | Stop) -> None:
        for control in self.controls:
            control.put(command)

    def receive(self, timeout: float | None) -> WorkerMessage:
        """The next message from any worker; raises if one failed or died, or if none spoke
        for ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                message: WorkerMessage = self.results.get(timeout=0.5)
            except queue.Empty:
                self._dead_raise()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"no word from the Hogwild workers in {timeout} s") from None
                continue
            if isinstance(message, WorkerFailed):
                raise RuntimeError(f"Hogwild worker {message.rank} failed:\n{message.traceback}")
            return message

    def _dead_raise(self) -> None:
        dead = [(r, p.exitcode) for r, p in enumerate(self.processes) if p.exitcode is not None]
        if dead:
            raise RuntimeError(
                "Hogwild worker(s) ended unexpectedly: "
                + ", ".join(f"rank {r} with exit code {code}" for r, code in dead)
            ) from None

    def join(self) -> None:
        """Tell the workers to exit, and wait for them."""
        self.send(Stop())
        for process in self.processes:
            process.join(STOP_TIMEOUT_S)

    def close(self) -> None:
        """Stop whatever still runs, and let go of the results queue."""
        workers_stop(self.processes)
        self.results.close()
        self.results.cancel_join_thread()


def _start_with_requests_blocked(process: Any) -> None:
    """Start a worker with SIGUSR1 blocked, as it starts (the mask survives exec, a handler
    does not): one sent to every process of the run before the worker ignores it would kill
    it. The parent's own request, if one came meanwhile, is delivered when it unblocks."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def workers_stop(workers: list[Any], grace: float = 5.0) -> None:
    """SIGTERM the workers still running, wait, then SIGKILL what is left; reap them all."""
    for p in workers:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in workers:
        if p.is_alive():
            p.kill()
            p.join(5.0)


# --- in the worker processes -----------------------------------------------------------------


def worker_main(
    args: WorkerArgs, model: nn.Module, results: Any, control: Any, wanted: Any
) -> None:
    """One Hogwild worker: train on this rank's shard each epoch the parent starts."""
    _worker_process_setup(args)
    cfg = args.cfg
    try:
        data = (
            segment_attach(args.segment)
            if args.segment is not None
            else load_dataset(cfg.dataset, Path(cfg.data_dir))
        )
        optimizer = optimizer_make(cfg, model)
        if args.optimizer_state is not None:
            checkpoint.optimizer_state_load(optimizer, args.optimizer_state, lr=cfg.lr)
        params_shared = [p.is_shared() for p in model.parameters()]
        results.put(Ready(args.rank, os.getpid(), shared_flags(data), params_shared))
        step_fn = step_default(model, optimizer)
        # Worker 0 answers checkpoint requests.
        answers = wanted if args.rank == 0 else None
        while isinstance(work := control.get(), EpochStart):
            whole = _worker_epoch(
                args, work, model=model, optimizer=optimizer, step_fn=step_fn, data=data,
                results=results, answers=answers,
            )  # fmt: skip
            # A copy: pickling would otherwise move the live state into shared memory, and the
            # parent would write a checkpoint of tensors this worker goes on changing.
            state = copy.deepcopy(optimizer.state_dict()) if cfg.checkpoint_dir else None
            results.put(EpochDone(args.rank, work.epoch, whole.row(), state))
    except BaseException:
        with contextlib.suppress(Exception):
            results.put(WorkerFailed(args.rank, traceback.format_exc()))
        raise


def _worker_process_setup(args: WorkerArgs) -> None:
    """What a spawned worker sets before it trains: it dies with the parent, and leaves
    signals meant for the run to the parent."""
    parent_death_signal_set()
    # The parent may have died before prctl took effect.
    if os.getppid() != args.parent_pid:
        os._exit(1)
    allocator_tune()  # a spawned interpreter: the parent's setting is not inherited
    # Ctrl-C reaches the whole process group; the parent decides, and stops the workers. The
    # parent takes checkpoint requests too: one sent to the group must not kill a worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    torch.set_num_threads(args.threads)


def _worker_epoch(
    args: WorkerArgs,
    work: EpochStart,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step_fn: StepFn,
    data: Dataset,
    results: Any,
    answers: Any | None,
) -> Window:
    """Train this worker's shard of ``work.epoch``, reporting steps (and, where ``answers`` is
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
    """Copies of this worker's model and optimizer state, as of its last step: sent as they
    are, they would move into shared memory and go on changing."""
    model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model_state, copy.deepcopy(optimizer.state_dict())
