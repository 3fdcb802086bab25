"""Supervising this machine's part of one attempt: the loop over the training's output.

The task (tasks.py) claims the run and sends its further nodes their tasks; here the claimed
attempt is started and supervised, and settled through lifecycle.py. The loop's parts each have
a module: the training process (process.py), the relay of its events (relay.py, pure), the
row's requests (requests.py), liveness (liveness.py), multi-node settlement (settlement.py) and
the outcome (outcome.py); what they share is the attempt's state (state.py). The training
speaks the protocol of `training/protocol.py` on stdout; nothing else of it is known here.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError

from dashboard.devices.facts import machine_samples_collect
from dashboard.env import env_float
from dashboard.experiments.core.catalogue_checks import FOLDER_DATASETS
from dashboard.experiments.core.language_fields import run_language
from dashboard.experiments.core.messages import Body
from dashboard.experiments.core.profiles import profiles_dir
from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import (
    PROCESS_STRATEGIES,
    Experiment,
    Status,
)
from dashboard.experiments.runs.attempts import checkpoint_latest, experiment_resume_prepare
from dashboard.experiments.runs.executor import Executor
from dashboard.experiments.runs.lifecycle import run_finish, run_restart
from dashboard.experiments.runs.liveness import Liveness, heartbeat_interval
from dashboard.experiments.runs.nodes import (
    node_entry,
    node_flags,
    rank_machines_store,
    rank_pids_here,
    run_multinode,
    runs_on_machine,
)
from dashboard.experiments.runs.outcome import attempt_outcome, teardown_failure
from dashboard.experiments.runs.process import TrainingProcess, training_process_start
from dashboard.experiments.runs.processes import process_tree_stop
from dashboard.experiments.runs.relay import EventRelay
from dashboard.experiments.runs.requests import RunRequests
from dashboard.experiments.runs.settlement import NodePart, node_outcome
from dashboard.experiments.runs.sink import MAX_RANKS, EventSink
from dashboard.experiments.runs.state import AttemptState
from dashboard.experiments.runs.stragglers import events_flush
from dashboard.experiments.runs.survival import supervisor_started
from dashboard.experiments.scheduling.allocation import machine_local, run_cpu_threads
from dashboard.experiments.scripts.attempt import script_code_folder, script_flags
from dashboard.experiments.scripts.environment import script_environment
from training.catalogue import MODEL_DEFAULT
from training.protocol import Event
from training.registry import strategy_get

log = logging.getLogger(__name__)

# The longest the loop waits for a line before it looks at stops, beats and samples.
POLL_SECONDS = 0.1
STOP_POLL_SECONDS = 0.5


def training_command(*, experiment: Experiment) -> list[str]:
    run_dir = Path(settings.TRAINYARD_RUNS_DIR) / str(experiment.pk)
    command = [
        sys.executable,
        "-m",
        "training",
        "--run-id",
        str(experiment.pk),
        "--strategy",
        experiment.strategy,
    ]
    if strategy_get(experiment.strategy).user_script:
        # The user's own script: the launcher's flags only; its code folder and arguments are
        # the attempt's (RunSupervisor._start).
        return command + script_flags(experiment=experiment, checkpoint_dir=run_dir / "checkpoints")
    command += [
        "--dataset",
        experiment.dataset,
        "--epochs",
        str(experiment.epochs),
        "--batch-size",
        str(experiment.batch_size),
        "--lr",
        repr(experiment.lr),
        "--optimizer",
        experiment.optimizer,
        "--seed",
        str(experiment.seed),
        "--data-dir",
        str(settings.TRAINYARD_DATA_DIR),
        "--checkpoint-dir",
        str(run_dir / "checkpoints"),
        # Profiles on request (runs/profiles.py); a strategy that cannot record them says so.
        "--profile-dir",
        str(profiles_dir(experiment_id=experiment.pk)),
    ]
    # Said only when not the default: an engine from before the catalogue has no --model.
    if experiment.model and experiment.model != MODEL_DEFAULT:
        command += ["--model", experiment.model]
    # Only an image or text folder reads a path (the engine refuses --data-path elsewhere).
    if experiment.data_path and experiment.dataset in FOLDER_DATASETS:
        command += ["--data-path", experiment.data_path]
    command += language_flags(experiment=experiment)
    if experiment.strategy in PROCESS_STRATEGIES:
        command += ["--nproc", str(experiment.processes)]
    # The strategy's own settings (ZeRO's stage), with the flags the registry declares.
    for option in strategy_get(experiment.strategy).options:
        value = getattr(experiment, option.name)
        command += option.cli_args(option.default if value is None else value)
    if experiment.gpus:
        command += ["--gpus", ",".join(str(g) for g in experiment.gpus)]
    if experiment.target_accuracy is not None:  # a study's stop-at-target
        command += ["--target-accuracy", repr(experiment.target_accuracy)]
    return command


def language_flags(*, experiment: Experiment) -> list[str]:
    """A language model's size and window, as the run stores them, and tensor parallel's split
    by sequence where its strategy reads it (the engine refuses them for the other models)."""
    if not run_language(model=experiment.model, dataset=experiment.dataset):
        return []
    flags = ["--model-size", experiment.model_size] if experiment.model_size else []
    if experiment.seq_len:
        flags += ["--seq-len", str(experiment.seq_len)]
    if experiment.sequence_parallel is not None:
        flags.append("--sequence-parallel" if experiment.sequence_parallel else
                     "--no-sequence-parallel")  # fmt: skip
    return flags


def experiment_supervise(
    *, experiment_id: int, worker: str, executor: Executor | None = None
) -> str | None:
    """Supervise the attempt this worker just claimed (tasks.run_experiment) to its end; returns
    the status it settled the run in, or None when the run was not this attempt's to settle.
    `executor`: the scheduler the attempt runs under (a Slurm job: runs/slurm/job.py)."""
    experiment = Experiment.objects.get(pk=experiment_id)
    resume = experiment_resume_prepare(experiment=experiment)
    sink = EventSink(experiment)
    sink.add(
        {
            "type": "status",
            "status": Status.RUNNING,
            "worker": worker,
            # The page opened while queued has neither: its Started and Duration need them.
            "started_at": experiment.started_at.isoformat() if experiment.started_at else None,
            "attempt": experiment.attempt,
            "resumed": experiment.attempt > 1,
        }
    )
    sink.flush()
    return attempt_supervise(
        experiment=experiment, sink=sink, resume=resume, node_rank=0, executor=executor
    )


def experiment_node_supervise(
    *, experiment_id: int, attempt: int, node_rank: int, worker: str
) -> str | None:
    """Node `node_rank` (1 and up) of a multi-node run's attempt, on this machine (nodes.py)."""
    experiment = Experiment.objects.filter(
        pk=experiment_id, status=Status.RUNNING, attempt=attempt
    ).first()
    if experiment is None or not 0 < node_rank < len(experiment.placement or []):
        return None  # the attempt is not running any more
    placed = node_entry(experiment, node_rank).get("worker")
    if placed != worker:
        log.warning("node %s of run %s is %s's, not %s", node_rank, experiment_id, placed, worker)
        return None
    # This process's view of the run is its own machine's: its samples, threads, checkpoints.
    experiment.worker = worker
    latest = checkpoint_latest(experiment_id=experiment_id) if attempt > 1 else None
    resume = Path(latest.path) if latest else None
    sink = EventSink(experiment)
    return attempt_supervise(experiment=experiment, sink=sink, resume=resume, node_rank=node_rank)


def attempt_supervise(
    *, experiment: Experiment, sink: EventSink, resume: Path | None, node_rank: int,
    executor: Executor | None = None,
) -> str | None:  # fmt: skip
    """Supervise this machine's part of an attempt to its end, and settle the run if it is this
    machine's to say (on several machines, settlement.py says whose)."""
    outcome = RunSupervisor(
        experiment=experiment, sink=sink, resume=resume, node_rank=node_rank, executor=executor
    ).run()
    if outcome is None:
        log.warning(
            "experiment %s: this machine's part ended; the run is left to its other nodes or "
            "its new owner",
            experiment.pk,
        )
        return None
    if outcome.restart:  # Stop and resume: queued again, for the caller to send
        restarted = run_restart(experiment=experiment, sink=sink, outcome=outcome)
        return Status.QUEUED if restarted else None
    if not run_finish(experiment=experiment, sink=sink, outcome=outcome):
        return None  # the run moved on before this attempt settled
    return outcome.status


def sample_interval() -> float:
    """Seconds between samples of the worker's CPU and GPUs while a run is on it."""
    return max(0.2, env_float("TRAINYARD_SAMPLE_SECONDS", 2.0))


def training_environment(*, experiment: Experiment) -> dict[str, str]:
    machine = machine_local(worker=experiment.worker)
    threads = run_cpu_threads(
        strategy=experiment.strategy,
        processes=experiment.processes,
        gpus=experiment.gpus,
        cpu_count=machine.cpu_count,
    )
    per_process = 1 if experiment.strategy in PROCESS_STRATEGIES else max(threads, 1)
    # A user's script runs arbitrary code: it gets no secret of the worker's (environment.py).
    script = strategy_get(experiment.strategy).user_script
    return {
        **(script_environment() if script else os.environ),
        "PYTHONUNBUFFERED": "1",
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
        # GPU ids are NVML's, in PCI order; CUDA must number them the same way.
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        # The allocation counted this many threads for the run: hold it to that.
        "OMP_NUM_THREADS": str(per_process),
        # Lets a worker that starts later tell this run's processes from live ones.
        "TRAINYARD_SUPERVISOR_PID": str(os.getpid()),
        "TRAINYARD_SUPERVISOR_STARTED": repr(supervisor_started()),
        "TRAINYARD_RUN_ID": str(experiment.pk),
        # The events carry what rank 0's info lines say; keep its warnings and errors. The other
        # ranks' info lines are said nowhere else (the log keeps them with their rank).
        "TRAINYARD_LOG_LEVEL": "WARNING",
        "TRAINYARD_RANKS_LOG_LEVEL": "INFO",
    }


class RunSupervisor:
    def __init__(
        self,
        *,
        experiment: Experiment,
        sink: EventSink,
        resume: Path | None = None,
        node_rank: int = 0,
        executor: Executor | None = None,
    ):
        self.experiment = experiment
        self.sink = sink
        self.resume = resume
        # On several machines, this machine's part (nodes.py); its log lines name the machine.
        # Under a scheduler (`executor`), this one supervisor starts and hears every node.
        self.node_rank = node_rank
        self.executor = executor
        self.multinode = executor is None and run_multinode(experiment)
        self.machine = experiment.worker if self.multinode else ""
        self.state = AttemptState()
        self.relay = EventRelay(state=self.state, machine=self.machine, multinode=self.multinode)
        self.process: TrainingProcess | None = None  # the launcher, once started
        self.requests: RunRequests | None = None
        self.clock_zero = time.monotonic()  # the training's time 0, as this process's clock

    def run(self) -> Outcome | None:
        """Start the training, relay its output until both streams close, and say how this
        machine's part ended (None: not this machine's to settle). A supervisor error stops the
        training: it must not run on unsupervised, nor leave the run "running"."""
        try:
            returncode = self._supervise()
            if self.state.taken_over or (self.executor and self.executor.ended_outside()):
                return None
            return self.outcome(returncode)
        except Exception as exc:
            log.exception("supervising experiment %s failed", self.experiment.pk)
            if self.process is not None:
                self.process.stop(rank_pids=self.state.rank_pids, grace_seconds=2)
            return Outcome(Status.FAILED, error=f"supervisor error: {exc}")

    def _supervise(self) -> int:
        process = self.process = self._start()
        requests = self.requests_for(process)
        liveness = Liveness(experiment=self.experiment, sink=self.sink, state=self.state,
                            process=process, node_rank=self.node_rank, machine=self.machine,
                            multinode=self.multinode)  # fmt: skip
        open_streams = 2
        self.clock_zero = next_stop_check = next_beat = time.monotonic()
        machine_samples_collect(worker=self.experiment.worker)  # primes psutil's CPU percent
        next_sample = self.clock_zero + sample_interval()
        while open_streams:
            due = self.sink.due_in(time.monotonic())
            source, line = process.line_next(
                POLL_SECONDS if due is None else min(POLL_SECONDS, due)
            )
            if line is None:
                open_streams -= 1
            if self.state.taken_over:
                continue  # its processes are ended: wait for their streams, not the database
            now = time.monotonic()
            self._teardown_bound(process, now)  # before the database's steps, which may fail
            try:  # every step may write the database; a lost one must not orphan the training
                if line:
                    self.line_take(source, line)
                self.sink_add(self.relay.stderr_relay(now))
                if now >= next_sample:
                    next_sample = now + sample_interval()
                    samples = machine_samples_collect(worker=self.experiment.worker)
                    self.sink.add_series(samples, time_=round(now - self.clock_zero, 3))
                if self.sink.due_in(now) == 0:
                    # At once when sparse, coalesced under load (see sink.py); then a straggler
                    # is looked for in the ranks' phases it stored (stragglers.py).
                    events_flush(sink=self.sink)
                if now >= next_stop_check and self.state.stopped_by is None:
                    next_stop_check = now + STOP_POLL_SECONDS
                    requests.requests_check()
                requests.stop_overdue(now)
                if now >= next_beat:
                    next_beat = now + heartbeat_interval()
                    liveness.heartbeat()
                if self.executor is not None:
                    self.executor.turn(supervisor=self, now=now)
            except DatabaseError as exc:
                liveness.database_unreachable(exc)
        returncode = self.state.returncode = process.wait()
        if not self.state.taken_over:
            self.sink_add(self.relay.stderr_relay(math.inf))
            events_flush(sink=self.sink)
        return returncode

    def _teardown_bound(self, process: TrainingProcess, now: float) -> None:
        """End the processes that outlive `finished` by TRAINYARD_TEARDOWN_SECONDS: the results
        are in, and a hung teardown must not hold the run (or its machines) open."""
        if not self.state.training_finished() or self.state.teardown_ended:
            return
        self.state.finished_seen = self.state.finished_seen or now
        if now - self.state.finished_seen < settings.TRAINYARD_TEARDOWN_SECONDS:
            return
        # The streams are still open (the loop runs): the launcher, or a rank of a launcher
        # that has exited, still holds them.
        self.state.teardown_ended = True
        process.stop(rank_pids=self.state.rank_pids, grace_seconds=2)

    def _start(self) -> TrainingProcess:
        command = training_command(experiment=self.experiment)
        script = strategy_get(self.experiment.strategy).user_script
        if script:  # the attempt's code folder (ScriptCodeUnavailable fails the attempt)
            command += ["--code-dir", str(script_code_folder(experiment=self.experiment))]
        if self.resume is not None:
            command += ["--resume", str(self.resume)]
        if self.multinode:
            command += node_flags(experiment=self.experiment, node_rank=self.node_rank)
        elif self.executor is not None and self.experiment.nodes > 1:
            command += self.executor.rendezvous_flags(experiment=self.experiment)
        # Last: the launcher's parser stops at "--", the rest is the script's.
        tail = ["--", *self.experiment.args] if script else []
        # Each rank names its machine in `started` (placement's ranks come from it).
        env = {**training_environment(experiment=self.experiment),
               "TRAINYARD_WORKER_NAME": self.experiment.worker}  # fmt: skip
        if script and self.resume is not None:
            # The step the checkpoint holds (the run is back at it: attempts.py): a script's
            # observer counts its steps on from there, as the script does from its checkpoint.
            env["TRAINYARD_RESUME_STEP"] = str(self.experiment.step)
        if self.executor is not None:
            process = self.executor.start(
                command=command, tail=tail, env=env, cwd=settings.BASE_DIR
            )
        else:
            command += tail
            process = training_process_start(command=command, env=env, cwd=settings.BASE_DIR)
        log.info("experiment %s: pid %s: %s", self.experiment.pk, process.pid, " ".join(command))
        if self.node_rank == 0:  # the run's row is node 0's; the others' is their RunNode
            Experiment.objects.filter(pk=self.experiment.pk).update(launcher_pid=process.pid)
        return process

    def line_take(self, source: str, line: str) -> None:
        """Relay one line of output, act on what it said, and hand the sink its entries."""
        relayed = self.relay.line_relay(source, line)
        started = self.state.started_event if relayed.started else None
        if started is not None and self.multinode and isinstance(started.get("machines"), list):
            rank_machines_store(experiment=self.experiment, machines=self.state.rank_machines)
        elif started is not None and self.executor is not None:
            # Under a scheduler the ranks say their hosts, which are its nodes' names.
            machines = started.get("machines")
            if isinstance(machines, list) and len(machines) <= MAX_RANKS:
                rank_machines_store(experiment=self.experiment, machines=[str(m) for m in machines])
        elif started is not None and not self.multinode:
            # One machine: every rank is on the one that claimed the run.
            world = started.get("world_size")
            ranks = world if isinstance(world, int) and 0 < world <= MAX_RANKS else 1
            here = [self.experiment.worker] * ranks
            rank_machines_store(experiment=self.experiment, machines=here)
        if started is not None:
            # Samples share the training's clock (seconds since it started), not this process's.
            self.clock_zero = time.monotonic() - float(started.get("time") or 0)
        if relayed.checkpoint_answered and self.requests is not None:
            self.requests.checkpoint_request_answered()
        self.sink_add(relayed.entries)

    def sink_add(self, entries: Iterable[Event | Body]) -> None:
        for entry in entries:
            self.sink.add(entry)

    def outcome(self, returncode: int) -> Outcome | None:
        """How this machine's part ended; on several machines, None when the run is not this
        node's to settle (settlement.py)."""
        outcome = attempt_outcome(state=self.state, returncode=returncode,
                                  stderr_tail=self.relay.stderr_tail)  # fmt: skip
        if failure := teardown_failure(state=self.state, returncode=returncode):
            self.sink.add({"type": "log", "level": "warning", "message": failure})
        if not self.multinode:
            return outcome
        part = NodePart(experiment=self.experiment, node_rank=self.node_rank, machine=self.machine)
        return node_outcome(part=part, state=self.state, outcome=outcome)

    def requests_for(self, process: TrainingProcess) -> RunRequests:
        self.requests = RunRequests(experiment=self.experiment, sink=self.sink, state=self.state,
                                    process=process)  # fmt: skip
        return self.requests


def experiments_stop_for_worker_shutdown(*, worker: str) -> list[int]:
    """End the process trees of the runs this worker supervises; returns their ids."""
    rows = Experiment.objects.filter(status=Status.RUNNING, worker=worker).exclude(
        launcher_pid=None
    )
    ended = []
    for experiment in rows:
        info = experiment.run_info or {}
        pids = rank_pids_here(pids=info.get("pids"), machines=info.get("machines"),
                              machine=worker if experiment.nodes > 1 else None)  # fmt: skip
        log.warning("worker shutting down: ending run %s", experiment.pk)
        process_tree_stop(
            root_pid=experiment.launcher_pid or 0,
            extra_pids=pids,
            grace_seconds=settings.TRAINYARD_STOP_GRACE_SECONDS,
        )
        ended.append(experiment.pk)
    for node in runs_on_machine(worker=worker):  # parts of runs other machines claimed
        log.warning("worker shutting down: ending node %s of run %s", node.node_rank,
                    node.experiment_id)  # fmt: skip
        process_tree_stop(root_pid=node.launcher_pid or 0, extra_pids=[],
                          grace_seconds=settings.TRAINYARD_STOP_GRACE_SECONDS)  # fmt: skip
        ended.append(node.experiment_id)
    return ended
