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
import ctypes
import logging
import os
import queue
import signal
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

from training import checkpoint
from training.allocator import allocator_tune
from training.batching import rank_batches, steps_per_epoch
from training.config import TrainConfig
from training.data import Dataset, load_dataset
from training.meter import Window, report_from_rows
from training.model import SimpleCNN
from training.protocol import EventWriter
from training.run_requests import checkpoint_request_take
from training.runtime import Runtime
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


@dataclass(frozen=True)
class WorkerArgs:
    rank: int
    cfg: TrainConfig
    segment: Segment | None  # None: no shared copy could be made, load privately
    optimizer_state: dict[str, Any] | None
    threads: int
    parent_pid: int


def train(cfg: TrainConfig, rt: Runtime, events: EventWriter) -> None:
    # Imported here: engine imports this module lazily, and this one uses engine's helpers.
    from training.engine import (
        ResumePoint,
        checkpoint_write,
        evaluate,
        finished_emit,
        log_to,
        resume_apply,
        started_fields,
    )

    t_start = time.monotonic()
    if rt.device.type != "cpu":
        raise RuntimeError("hogwild trains on the CPU (the CLI refuses --gpus for it)")
    torch.manual_seed(cfg.seed)
    model = SimpleCNN()
    state = checkpoint.load_for(cfg) if cfg.resume else None
    notes: list[str] = []
    if state is not None:
        model.load_state_dict(state["model"])
    # Before spawning: the workers receive handles to these storages, not copies.
    model.share_memory()
    nproc = cfg.nproc
    threads = max(1, torch.get_num_threads() // nproc)
    notes.append(
        f"Hogwild ran {nproc} worker process(es), {threads} thread(s) each, updating one shared "
        f"model without locks; each step of each worker covers {cfg.batch_size} images."
    )

    path = segment_path(os.getpid(), f"hogwild-{uuid.uuid4().hex[:12]}-{cfg.dataset}")
    workers: list[Any] = []
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    # Set by the parent when a checkpoint is requested; worker 0 answers with its state.
    wanted = ctx.Event()
    controls: list[Any] = []
    try:
        data, segment = _dataset_owned(cfg, path)
        per_epoch = steps_per_epoch(len(data.train), cfg.batch_size, nproc, cfg.step_limit)
        resume = ResumePoint()
        if state is not None:
            # The workers build their optimizers; each loads the checkpoint's state.
            resume = resume_apply(
                cfg, state, None, notes, global_batch=cfg.batch_size * nproc, per_epoch=per_epoch
            )
        start_epoch, step = resume.start_epoch, resume.step
        optimizer_states = workers_optimizer_states(state, nproc, notes)
        for rank in range(nproc):
            control = ctx.SimpleQueue()
            args = WorkerArgs(rank, cfg, segment, optimizer_states[rank], threads, os.getpid())
            p = ctx.Process(
                target=worker_main,
                args=(args, model, results, control, wanted),
                name=f"trainyard-hogwild-{rank}",
                daemon=True,
            )
            _start_with_requests_blocked(p)
            workers.append(p)
            controls.append(control)
        ready = [_receive(results, workers, "ready", START_TIMEOUT_S) for _ in range(nproc)]
        ready.sort(key=lambda m: m[1])
        # Every worker has mapped the data: the name can go, the memory stays until all unmap.
        segment_remove(path)

        data_flags = [
            all(flags) for flags in zip(shared_flags(data), *(m[3] for m in ready), strict=True)
        ]
        shared = shared_tensors_report(data, data_flags)
        for i, (name, param) in enumerate(model.named_parameters()):
            everywhere = param.is_shared() and all(m[4][i] for m in ready)
            shared.append(tensor_entry(f"model.{name}", param, everywhere))

        events.emit(
            "started",
            **started_fields(cfg, rt, data, per_epoch, start_epoch, world=nproc),
            devices=["cpu"] * nproc,
            pids=[m[2] for m in ready],
            launcher_pid=os.getpid(),
            requests_pid=os.getpid(),
            notes=notes,
            shared_tensors=shared,
        )
        log_to(events, rt, f"Data: {data.source}.", "warning" if data.substitute else "info")
        if start_epoch > cfg.epochs:
            log_to(events, rt, f"The checkpoint already covers {cfg.epochs} epoch(s).")

        test_loss, test_accuracy = None, 0.0
        for epoch in range(start_epoch, cfg.epochs + 1):
            skip = resume.skip_batches if epoch == start_epoch else 0
            for control in controls:
                control.put(("epoch", epoch, step, skip))
            done = _epoch_collect(cfg, events, results, workers, wanted, epoch, step, skip)
            step += per_epoch - skip
            report = report_from_rows([d[3] for d in done])
            test_loss, test_accuracy = evaluate(model, data, rt, cfg.test_batch_size)
            events.emit(
                "epoch",
                epoch=epoch,
                step=step,
                test_loss=test_loss,
                test_accuracy=test_accuracy,
                **report,
            )
            log.info("epoch %d: test loss %s, accuracy %.4f", epoch, test_loss, test_accuracy)
            if cfg.checkpoint_dir:
                # Worker 0's optimizer is the one other strategies resume; Hogwild takes each.
                # It answers a request worker 0 had no step left for.
                asked = checkpoint_request_take() or wanted.is_set()
                wanted.clear()
                checkpoint_write(
                    cfg, events, model_state=model.state_dict(), optimizer_state=done[0][4],
                    epoch=epoch, step=step, extra={WORKER_OPTIMIZERS: [d[4] for d in done]},
                    answers_request=asked,
                )  # fmt: skip
        if start_epoch > cfg.epochs:
            test_loss, test_accuracy = evaluate(model, data, rt, cfg.test_batch_size)
        finished_emit(
            events, cfg, test_loss, test_accuracy, start_epoch=start_epoch, step=step,
            t_start=t_start,
        )  # fmt: skip
        # After the event: the results are in; the workers' exit (seconds of interpreter
        # teardown) is no part of the training time.
        for control in controls:
            control.put(("stop",))
        for p in workers:
            p.join(STOP_TIMEOUT_S)
    finally:
        workers_stop(workers)
        segment_remove(path)
        results.close()
        results.cancel_join_thread()


def workers_optimizer_states(
    state: dict[str, Any] | None, nproc: int, notes: list[str]
) -> list[dict[str, Any] | None]:
    """The optimizer state each worker starts from: its own where the checkpoint has one per
    worker for as many workers, else worker 0's (or a single process's) for all."""
    if state is None or not checkpoint.holds_torch_optimizer(state):
        return [None] * nproc
    own = state.get(WORKER_OPTIMIZERS)
    if isinstance(own, list) and len(own) == nproc and all(isinstance(o, dict) for o in own):
        if nproc > 1:
            notes.append(f"Each of the {nproc} workers resumed its own optimizer state.")
        return list(own)
    if nproc > 1:
        notes.append(
            "The checkpoint holds one optimizer state (a requested checkpoint keeps worker 0's, "
            "another strategy's its only one, or another number of workers); every worker "
            "starts from it."
        )
    return [state["optimizer"]] * nproc


def _start_with_requests_blocked(process: Any) -> None:
    """Start a worker with SIGUSR1 blocked, as it starts (the mask survives exec, a handler
    does not): one sent to every process of the run before the worker ignores it would kill
    it. The parent's own request, if one came meanwhile, is delivered when it unblocks."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def _dataset_owned(cfg: TrainConfig, path: Path) -> tuple[Dataset, Segment | None]:
    stale_segments_remove()
    try:
        return segment_create(cfg.dataset, Path(cfg.data_dir), path)
    except OSError as exc:
        segment_remove(path)
        log.warning("no shared copy of the dataset (%s); each worker loads its own", exc)
        return load_dataset(cfg.dataset, Path(cfg.data_dir)), None


def _epoch_collect(
    cfg: TrainConfig,
    events: EventWriter,
    results: Any,
    workers: list[Any],
    wanted: Any,
    epoch: int,
    step: int,
    skip: int,
) -> list[tuple[Any, ...]]:
    """Relay the workers' step reports as step events, and requested checkpoints, until every
    worker has finished ``epoch``; returns their epoch_done messages in rank order."""
    from training.engine import checkpoint_request_refuse, checkpoint_write

    nproc = len(workers)
    pending: dict[int, dict[int, list[float]]] = {}
    done: dict[int, tuple[Any, ...]] = {}
    while len(done) < nproc:
        # No deadline: reports come every --log-interval steps, which may take long; a worker
        # that dies is noticed at once, and SIGTERM ends a run that hangs.
        message = _receive(results, workers, None, None)
        if checkpoint_request_take():
            if cfg.checkpoint_dir:
                wanted.set()
            else:
                checkpoint_request_refuse(events, step=step)
        if message[0] == "checkpoint":
            # Worker 0's model and optimizer at its step `local`; the other workers are a few
            # steps either side, as anything read from a Hogwild model is.
            _, _, local, model_state, optimizer_state = message
            checkpoint_write(
                cfg, events, model_state=model_state, optimizer_state=optimizer_state,
                epoch=epoch, step=step + local,
                images_into_epoch=(skip + local) * cfg.batch_size * nproc,
            )  # fmt: skip
        elif message[0] == "step":
            _, rank, _, local, row = message
            pending.setdefault(local, {})[rank] = row
            # Workers report at the same local steps, each in order: a step is complete when
            # the slowest worker has reported it, and steps complete in order.
            while pending and len(pending[min(pending)]) == nproc:
                local = min(pending)
                rows = pending.pop(local)
                report = report_from_rows([rows[r] for r in range(nproc)])
                events.emit("step", epoch=epoch, step=step + local, **report)
        elif message[0] == "epoch_done":
            done[message[1]] = message
        else:
            raise RuntimeError(f"unexpected message from a Hogwild worker: {message[0]}")
    return [done[r] for r in range(nproc)]


def _receive(
    results: Any, workers: list[Any], expect: str | None, timeout: float | None
) -> tuple[Any, ...]:
    """The next message from any worker; raises if one failed or died, or if none spoke for
    ``timeout`` seconds (None: no limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            message: tuple[Any, ...] = results.get(timeout=0.5)
        except queue.Empty:
            dead = [(r, p.exitcode) for r, p in enumerate(workers) if p.exitcode is not None]
            if dead:
                raise RuntimeError(
                    "Hogwild worker(s) ended unexpectedly: "
                    + ", ".join(f"rank {r} with exit code {code}" for r, code in dead)
                ) from None
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no word from the Hogwild workers in {timeout} s") from None
            continue
        if message[0] == "error":
            raise RuntimeError(f"Hogwild worker {message[1]} failed:\n{message[2]}")
        if expect is not None and message[0] != expect:
            raise RuntimeError(f"expected {expect!r} from a Hogwild worker, got {message[0]!r}")
        return message


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
    _die_with_parent(args.parent_pid)
    allocator_tune()  # a spawned interpreter: the parent's setting is not inherited
    # Ctrl-C reaches the whole process group; the parent decides, and stops the workers. The
    # parent takes checkpoint requests too: one sent to the group must not kill a worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    torch.set_num_threads(args.threads)
    cfg = args.cfg
    try:
        data = (
            segment_attach(args.segment)
            if args.segment is not None
            else load_dataset(cfg.dataset, Path(cfg.data_dir))
        )
        optimizer = optimizer_make(cfg, model)
        if args.optimizer_state is not None:
            optimizer.load_state_dict(args.optimizer_state)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr
        params_shared = [p.is_shared() for p in model.parameters()]
        results.put(("ready", args.rank, os.getpid(), shared_flags(data), params_shared))
        step_fn = step_default(model, optimizer)
        per_epoch = steps_per_epoch(len(data.train), cfg.batch_size, cfg.nproc, cfg.step_limit)
        while True:
            command = control.get()
            if command[0] != "epoch":
                break
            _, epoch, step_base, skip = command
            batches = rank_batches(
                len(data.train), cfg.batch_size, cfg.nproc, args.rank, cfg.seed, epoch
            )[:per_epoch][skip:]
            whole = _worker_epoch(
                cfg, args.rank, model, step_fn, data, batches, epoch, step_base, results,
                # Worker 0 answers checkpoint requests.
                (wanted, optimizer) if args.rank == 0 else None,
            )  # fmt: skip
            # A copy: pickling would otherwise move the live state into shared memory, and the
            # parent would write a checkpoint of tensors this worker goes on changing.
            state = copy.deepcopy(optimizer.state_dict()) if cfg.checkpoint_dir else None
            results.put(("epoch_done", args.rank, epoch, whole.row(), state))
    except BaseException:
        with contextlib.suppress(Exception):
            results.put(("error", args.rank, traceback.format_exc()))
        raise


def _worker_epoch(
    cfg: TrainConfig,
    rank: int,
    model: nn.Module,
    step_fn: Any,
    data: Dataset,
    batches: list[torch.Tensor],
    epoch: int,
    step_base: int,
    results: Any,
    checkpoints: tuple[Any, torch.optim.Optimizer] | None = None,
) -> Window:
    from training.engine import steps_run

    model.train()
    interval, whole = Window(_CPU), Window(_CPU)
    for i, timing in enumerate(steps_run(step_fn, data, batches, _CPU)):
        interval.add(timing)
        whole.add(timing)
        local = i + 1
        last = i == len(batches) - 1
        if (step_base + local) % cfg.log_interval == 0 or last:
            results.put(("step", rank, epoch, local, interval.row()))
            interval = Window(_CPU)
        # At the epoch's last step the parent's epoch checkpoint answers instead.
        if checkpoints is not None and not last and checkpoints[0].is_set():
            checkpoints[0].clear()
            results.put(("checkpoint", rank, local, *_checkpoint_copy(model, checkpoints[1])))
    return whole


def _checkpoint_copy(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[Any, Any]:
    """Copies of this worker's model and optimizer state, as of its last step: sent as they
    are, they would move into shared memory and go on changing."""
    model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return model_state, copy.deepcopy(optimizer.state_dict())


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGTERM this worker when the parent dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    # The parent may have died before prctl took effect.
    if os.getppid() != parent_pid:
        os._exit(1)
