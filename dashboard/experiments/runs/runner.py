"""Supervising one run: claim it, start the training process, relay its events, settle its status.

The training runs as a new interpreter in a session of its own (Celery's prefork children are
daemonic and may not have multiprocessing children). It speaks the protocol of
`training/protocol.py` on stdout; nothing else of it is known here.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, ClassVar, Literal, cast

from django import db
from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from dashboard.devices.facts import machine_samples_collect
from dashboard.env import env_float
from dashboard.experiments.core import transitions
from dashboard.experiments.core.messages import LogBody, RunFailedBody, RunFinishedBody
from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import (
    PROCESS_STRATEGIES,
    Experiment,
    Status,
)
from dashboard.experiments.runs.attempts import (
    attempts_with_current,
    checkpoint_latest,
    experiment_resume_prepare,
)
from dashboard.experiments.runs.nodes import (
    node_beat,
    node_end,
    node_entry,
    node_flags,
    node_peers,
    pids_on_machine,
    rank_machines_store,
    run_multinode,
    runs_on_machine,
)
from dashboard.experiments.runs.processes import (
    parent_death_signal_set,
    process_in_tree_signal,
    process_tree_stop,
)
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.survival import supervisor_started
from dashboard.experiments.scheduling.allocation import (
    Machine,
    Plan,
    machine_local,
    machines_lock,
    nodes_dispatch,
    placement_candidates,
    placement_plan,
    run_cpu_threads,
)
from dashboard.experiments.scheduling.queue import queue_turn_check, queue_turn_refusal
from training.protocol import (
    CheckpointEvent,
    EpochEvent,
    Event,
    FailedEvent,
    FinishedEvent,
    LogEvent,
    ProtocolVersionError,
    StartedEvent,
    StepEvent,
    log_line_read,
    parse_event,
)
from training.registry import strategy_get

log = logging.getLogger(__name__)

# The longest the loop waits for a line before it looks at stops, beats and samples.
POLL_SECONDS = 0.1
STOP_POLL_SECONDS = 0.5
STDERR_TAIL_LINES = 30
# On several machines: how long a node's processes may go on after another node's part failed
# (rank 0 reports the error it sees meanwhile) before this node ends them.
PEER_FAILED_GRACE_SECONDS = 5.0


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
    ]
    if experiment.strategy in PROCESS_STRATEGIES:
        command += ["--nproc", str(experiment.processes)]
    # The strategy's own settings (ZeRO's stage), with the flags the registry declares.
    for option in strategy_get(experiment.strategy).options:
        command += [option.flag, str(getattr(experiment, option.name) or option.default)]
    if experiment.gpus:
        command += ["--gpus", ",".join(str(g) for g in experiment.gpus)]
    if experiment.target_accuracy is not None:  # a study's stop-at-target
        command += ["--target-accuracy", repr(experiment.target_accuracy)]
    return command


@dataclass(frozen=True)
class Claim:
    claimed: bool
    waiting_reason: str = ""
    routed_to: str = ""  # the machine whose worker should claim it instead (allocation.Plan)


def experiment_claim(*, experiment_id: int, machine: Machine) -> Claim:
    """Start a queued run on this machine (node 0 of its machines) if their devices are free;
    else say what it waits for, or which machine's worker should claim it.

    Only a queued run can become running (a conditional update), so two workers can never both
    start one run; the machines' locks make the device check and the claim one step, for all
    the machines of a multi-node run at once. The caller sends the other nodes their tasks once
    this has committed (allocation.nodes_dispatch).
    """
    now = timezone.now()
    with transaction.atomic():
        experiment = Experiment.objects.filter(pk=experiment_id, status=Status.QUEUED).first()
        if experiment is None:
            return Claim(False)
        names = placement_candidates(experiment=experiment, local=machine)
        if machine.name not in names:
            return Claim(False, routed_to=names[0])
        rows = machines_lock(names)
        # Claim order first (queue.py: priority, then first in first out; the running limit).
        reason = queue_turn_refusal(experiment=experiment, machine=machine)
        plan = (
            Plan(reason=reason)
            if reason
            else placement_plan(
                experiment=experiment,
                local=machine,
                names=names,
                rows=rows,
                turn=queue_turn_check(experiment=experiment),
            )
        )
        if plan.route_to:
            return Claim(False, routed_to=plan.route_to)
        if plan.placement:
            started = transitions.experiment_start(
                experiment=experiment, worker=machine.name, now=now, placement=plan.placement
            )
            return Claim(started)
        reason = plan.reason
        Experiment.objects.filter(pk=experiment_id, status=Status.QUEUED).update(
            waiting_reason=reason[:300], heartbeat_at=now
        )
    if reason[:300] != experiment.waiting_reason:
        # Tell the run's page why it waits, once per change of reason.
        sink = EventSink(experiment)
        sink.add({"type": "status", "status": Status.QUEUED, "reason": reason})
        sink.flush()
    return Claim(False, reason)


@dataclass(frozen=True)
class RunResult:
    """What one delivery of a run's task came to.

    finished: this worker ran an attempt to its end, which left the run `status`.
    waiting: the run stays queued, its devices busy (`reason`); the task asks again later.
    skipped: nothing for this worker to do (`reason`): the run was not queued any more, or the
    reaper gave this attempt up while it ran and the run has moved on without it.
    routed: another machine's worker should claim it (`reason`: that machine's name): a run
    pinned there, or a multi-node run this machine cannot host now while others can.
    """

    kind: Literal["finished", "waiting", "skipped", "routed"]
    status: str | None = None
    reason: str = ""


def experiment_run(*, experiment_id: int, worker: str) -> RunResult:
    """Run a queued experiment to its end, if this worker can start it now."""
    claim = experiment_claim(experiment_id=experiment_id, machine=machine_local(worker=worker))
    if claim.waiting_reason:
        return RunResult("waiting", reason=claim.waiting_reason)
    if claim.routed_to:
        return RunResult("routed", reason=claim.routed_to)
    if not claim.claimed:
        log.info("experiment %s was not queued any more; not starting it", experiment_id)
        return RunResult("skipped", reason="not queued any more")
    nodes_dispatch(experiment_id=experiment_id)  # committed: each further node to its machine
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
    return attempt_supervise(experiment=experiment, sink=sink, resume=resume, node_rank=0)


def experiment_node_run(
    *, experiment_id: int, attempt: int, node_rank: int, worker: str
) -> RunResult:
    """Node `node_rank` (1 and up) of a multi-node run's attempt, on this machine (nodes.py)."""
    experiment = Experiment.objects.filter(
        pk=experiment_id, status=Status.RUNNING, attempt=attempt
    ).first()
    if experiment is None or not 0 < node_rank < len(experiment.placement or []):
        return RunResult("skipped", reason="the attempt is not running any more")
    placed = node_entry(experiment, node_rank).get("worker")
    if placed != worker:
        log.warning("node %s of run %s is %s's, not %s", node_rank, experiment_id, placed, worker)
        return RunResult("skipped", reason=f"node {node_rank} is placed on {placed}")
    # This process's view of the run is its own machine's: its samples, threads, checkpoints.
    experiment.worker = worker
    latest = checkpoint_latest(experiment_id=experiment_id) if attempt > 1 else None
    resume = Path(latest.path) if latest else None
    sink = EventSink(experiment)
    return attempt_supervise(experiment=experiment, sink=sink, resume=resume, node_rank=node_rank)


def attempt_supervise(
    *, experiment: Experiment, sink: EventSink, resume: Path | None, node_rank: int
) -> RunResult:
    """Supervise this machine's part of an attempt to its end, and settle the run if it is this
    machine's to say (on several machines, nodes.py says whose)."""
    supervisor: RunSupervisor | None = None
    try:
        supervisor = RunSupervisor(
            experiment=experiment, sink=sink, resume=resume, node_rank=node_rank
        )
        outcome = supervisor.run()
        if outcome is not None and supervisor.multinode:
            outcome = supervisor.node_outcome(outcome)
    except Exception as exc:  # a supervisor bug must not leave the run "running"
        log.exception("supervising experiment %s failed", experiment.pk)
        if supervisor is not None:
            supervisor.processes_stop()  # nor its training running unsupervised
        outcome = Outcome(Status.FAILED, error=f"supervisor error: {exc}")
    if outcome is None:
        log.warning(
            "experiment %s: this machine's part ended; the run is left to its other nodes or "
            "its new owner",
            experiment.pk,
        )
        return RunResult("skipped", reason="taken over, or another node settles it")
    if not experiment_settle(experiment=experiment, sink=sink, outcome=outcome):
        return RunResult("skipped", reason="the run moved on before this attempt settled")
    return RunResult("finished", status=outcome.status)


def experiment_settle(*, experiment: Experiment, sink: EventSink, outcome: Outcome) -> bool:
    """Store the attempt's end; False when the run had moved on (its page hears nothing)."""
    finished_at = timezone.now()
    history = attempts_with_current(
        experiment=experiment, outcome=outcome.status, reason=outcome.error, ended_at=finished_at
    )
    settled = transitions.experiment_finish(
        experiment=experiment, outcome=outcome, history=history, finished_at=finished_at
    )
    if not settled:
        # The reaper gave this attempt up in the moment it ended; the run is the next one's, so
        # the page must not be told an end the database does not hold.
        log.warning(
            "experiment %s moved on before attempt %s settled", experiment.pk, experiment.attempt
        )
        sink.flush()
        return False
    sink.add(run_end_body(outcome))
    sink.flush()
    return True


def run_end_body(outcome: Outcome) -> RunFinishedBody | RunFailedBody:
    """The page's finished or failed message: the final status is the dashboard's to say."""
    if outcome.status == Status.SUCCEEDED:
        return {
            "type": "finished",
            "status": outcome.status,
            "test_loss": outcome.test_loss,
            "test_accuracy": outcome.test_accuracy,
        }
    return {"type": "failed", "status": outcome.status, "error": outcome.error}


def _pump(stream: IO[str], source: str, lines: queue.Queue[tuple[str, str | None]]) -> None:
    for line in stream:
        lines.put((source, line))
    lines.put((source, None))


def sample_interval() -> float:
    """Seconds between samples of the worker's CPU and GPUs while a run is on it."""
    return max(0.2, env_float("TRAINYARD_SAMPLE_SECONDS", 2.0))


def heartbeat_interval() -> float:
    return max(0.5, min(5.0, settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS / 6))


def training_environment(*, experiment: Experiment) -> dict[str, str]:
    machine = machine_local(worker=experiment.worker)
    threads = run_cpu_threads(
        strategy=experiment.strategy,
        processes=experiment.processes,
        gpus=experiment.gpus,
        cpu_count=machine.cpu_count,
    )
    per_process = 1 if experiment.strategy in PROCESS_STRATEGIES else max(threads, 1)
    return {
        **os.environ,
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
        # The events carry what the engine's info lines say; keep its warnings and errors.
        "TRAINYARD_LOG_LEVEL": "WARNING",
    }


class RunSupervisor:
    def __init__(
        self,
        *,
        experiment: Experiment,
        sink: EventSink,
        resume: Path | None = None,
        node_rank: int = 0,
    ):
        self.experiment = experiment
        # On several machines, this machine's part (nodes.py); its log lines name the machine.
        self.node_rank = node_rank
        self.multinode = run_multinode(experiment)
        self.machine = experiment.worker if self.multinode else ""
        self.rank_machines: list[str] = []
        self.peer_failed_at: float | None = None
        self.beat_failed_at: float | None = None
        self.sink = sink
        self.resume = resume
        self.taken_over = False
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.rank_pids: list[int] = []
        self.started_event: StartedEvent | None = None
        # The request passed on to the training and not yet answered by a checkpoint event.
        self.checkpoint_signalled: datetime | None = None
        self.final_event: dict[str, Any] | None = None
        self.stopped_by: str | None = None
        self.process: subprocess.Popen[str] | None = None  # the launcher, once started
        self.returncode: int | None = None  # the launcher's, once it exited
        self.echoes = StderrEchoes()
        self.clock_zero = time.monotonic()  # the training's time 0, as this process's clock

    def run(self) -> Outcome | None:
        process = self.process = self._start()
        open_streams = 2
        self.clock_zero = next_stop_check = next_beat = time.monotonic()
        machine_samples_collect(worker=self.experiment.worker)  # primes psutil's CPU percent
        next_sample = self.clock_zero + sample_interval()
        while open_streams:
            source, line = self._next_line()
            if line is None:
                open_streams -= 1
            if self.taken_over:
                continue  # its processes are ended: wait for their streams, not the database
            now = time.monotonic()
            try:  # every step may write the database; a lost one must not orphan the training
                if line:
                    self._take(source, line)
                self._stderr_release(self.echoes.release(now))
                if now >= next_sample:
                    next_sample = now + sample_interval()
                    samples = machine_samples_collect(worker=self.experiment.worker)
                    self.sink.add_series(samples, time_=round(now - self.clock_zero, 3))
                if self.sink.due_in(now) == 0:
                    self.sink.flush()  # at once when sparse, coalesced under load (see sink.py)
                if now >= next_stop_check and self.stopped_by is None:
                    next_stop_check = now + STOP_POLL_SECONDS
                    self._check_requests(process)
                if now >= next_beat:
                    next_beat = now + heartbeat_interval()
                    self._heartbeat(process)
            except DatabaseError as exc:
                self._database_unreachable(process, exc)
        returncode = self.returncode = process.wait()
        if self.taken_over:
            return None
        self._stderr_release(self.echoes.release(math.inf))
        self.sink.flush()
        return self._outcome(returncode)

    def _next_line(self) -> tuple[str, str | None]:
        """The next line of the training's output, ("", "") when none came before the sink's
        next send is due (or POLL_SECONDS)."""
        due = self.sink.due_in(time.monotonic())
        try:
            return self.lines.get(timeout=POLL_SECONDS if due is None else min(POLL_SECONDS, due))
        except queue.Empty:
            return "", ""

    def _heartbeat(self, process: subprocess.Popen[str]) -> None:
        if self.multinode:
            self._node_heartbeat(process)
            return
        alive = Experiment.objects.filter(
            pk=self.experiment.pk, status=Status.RUNNING, attempt=self.experiment.attempt
        ).update(heartbeat_at=timezone.now())
        self.beat_failed_at = None
        if alive:
            return
        # The reaper gave up on this attempt (it looked lost) and the run has moved on: end
        # this copy rather than train twice.
        self.taken_over = True
        process_tree_stop(root_pid=process.pid, extra_pids=self.rank_pids, grace_seconds=2)

    def _node_heartbeat(self, process: subprocess.Popen[str]) -> None:
        """This node's beat, and what the other nodes' rows say (nodes.py)."""
        now = time.monotonic()
        alive = node_beat(
            experiment=self.experiment,
            node_rank=self.node_rank,
            worker=self.machine,
            launcher_pid=process.pid,
        )
        peers = node_peers(experiment=self.experiment, node_rank=self.node_rank)
        self.beat_failed_at = None
        if not alive or peers.moved_on:
            self._node_processes_end(process, "the run moved on (lost, stopped or settled)")
        elif peers.failed and process.poll() is None:
            # Give rank 0 a moment to report the error it sees, then end what is blocked.
            self.peer_failed_at = self.peer_failed_at or now
            if now - self.peer_failed_at > PEER_FAILED_GRACE_SECONDS:
                self.sink.add_output(
                    f"ending this machine's processes: {'; '.join(peers.failed)}",
                    level="warning",
                    machine=self.machine,
                )
                process_tree_stop(root_pid=process.pid, extra_pids=[], grace_seconds=2)

    def _database_unreachable(self, process: subprocess.Popen[str], exc: DatabaseError) -> None:
        """Cut off from the database (a machine off the network): the reaper (on several
        machines, the other nodes) gives this attempt up after the heartbeat bound; by then its
        processes must be gone too."""
        db.close_old_connections()
        now = time.monotonic()
        self.beat_failed_at = self.beat_failed_at or now
        log.warning("experiment %s: the database is unreachable: %s", self.experiment.pk, exc)
        if now - self.beat_failed_at > settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS:
            self._node_processes_end(process, "this machine lost the database")

    def processes_stop(self) -> None:
        if self.process is not None:
            process_tree_stop(root_pid=self.process.pid, extra_pids=self.rank_pids, grace_seconds=2)

    def _node_processes_end(self, process: subprocess.Popen[str], why: str) -> None:
        if not self.taken_over:
            log.warning("experiment %s node %s: %s", self.experiment.pk, self.node_rank, why)
        self.taken_over = True
        process_tree_stop(root_pid=process.pid, extra_pids=self.rank_pids, grace_seconds=2)

    def node_outcome(self, outcome: Outcome) -> Outcome | None:
        """On several machines: the outcome this node settles the run with, or None when it is
        not this node's to say (nodes.py: who settles)."""
        self._node_end(outcome)
        if self._rank0_here():
            if outcome.status in (Status.SUCCEEDED, Status.CANCELLED):
                return outcome
            return self._peers_wait(outcome, holder=True)
        if self.node_rank == 0:
            # No events here: rank 0's node settles if it had any (a failure before `started`
            # too: a bad checkpoint, missing data; a Stop, which may have come after `finished`,
            # whose results must stand); if none had (a rendezvous error), node 0.
            return self._peers_wait(outcome, holder=False)
        return None  # rank 0's node, node 0 or the reaper says how it ended

    def _rank0_here(self) -> bool:
        """Whether rank 0, which alone writes events, ran on this node."""
        return self.started_event is not None or self.final_event is not None

    def _peers_wait(self, outcome: Outcome, *, holder: bool) -> Outcome | None:
        """Wait for every other node to end, then settle with what each ended with; without rank
        0's events (`holder` False) a moment longer, for rank 0's node to settle first."""
        deadline = time.monotonic() + 3 * settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS
        all_ended_at: float | None = None
        while time.monotonic() < deadline:
            node_beat(experiment=self.experiment, node_rank=self.node_rank,
                      worker=self.machine, launcher_pid=0)  # fmt: skip
            peers = node_peers(experiment=self.experiment, node_rank=self.node_rank)
            if peers.moved_on:
                return None
            if peers.cancel_requested and holder:
                return Outcome(Status.CANCELLED, error="Stopped.")
            if peers.running == 0:
                all_ended_at = all_ended_at or time.monotonic()
            if all_ended_at is not None and (
                holder or time.monotonic() - all_ended_at >= 2 * heartbeat_interval()
            ):
                if peers.cancel_requested:
                    return Outcome(Status.CANCELLED, error="Stopped.")
                failed = "\n".join(peers.failed)
                return Outcome(
                    outcome.status, error="\n".join(filter(None, [outcome.error, failed]))
                )
            time.sleep(heartbeat_interval())
        return outcome

    def _node_end(self, outcome: Outcome) -> None:
        # A node without rank 0 has no `finished` to see: exit 0 there is its part done well
        # (were it said failed, rank 0's node would end its training, in its final checkpoint).
        clean = not self._rank0_here() and self.returncode == 0 and self.stopped_by is None
        returncode = 0 if outcome.status == Status.SUCCEEDED or clean else 1
        try:
            node_end(experiment=self.experiment, node_rank=self.node_rank,
                     returncode=returncode, error=outcome.error)  # fmt: skip
        except DatabaseError:
            log.warning("experiment %s: could not record node %s's end", self.experiment.pk,
                        self.node_rank)  # fmt: skip

    def _start(self) -> subprocess.Popen[str]:
        command = training_command(experiment=self.experiment)
        if self.resume is not None:
            command += ["--resume", str(self.resume)]
        if self.multinode:
            command += node_flags(experiment=self.experiment, node_rank=self.node_rank)
        process = subprocess.Popen(  # noqa: S603 - the command is built from validated fields
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=parent_death_signal_set,  # noqa: PLW1509 - only prctl, no locks taken
            cwd=settings.BASE_DIR,
            env={
                **training_environment(experiment=self.experiment),
                # Each rank names its machine in `started` (placement's ranks come from it).
                "TRAINYARD_WORKER_NAME": self.experiment.worker,
            },
        )
        log.info("experiment %s: pid %s: %s", self.experiment.pk, process.pid, " ".join(command))
        if self.node_rank == 0:  # the run's row is node 0's; the others' is their RunNode
            Experiment.objects.filter(pk=self.experiment.pk).update(launcher_pid=process.pid)
        for stream, source in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            assert stream is not None
            threading.Thread(target=_pump, args=(stream, source, self.lines), daemon=True).start()
        return process

    def _take(self, source: str, line: str) -> None:
        if source == "stderr":
            self.stderr_tail.append(line.rstrip())
            self.echoes.hold(line, now=time.monotonic())
            return
        try:
            event = parse_event(line)
        except ProtocolVersionError as exc:
            self.sink.add_output(f"{exc}: {line}", level="error")
            return
        if event is None:
            if line.strip() and self.stopped_by is None:
                self.sink.add_output(line, level=source)
            return
        take = self.TAKE.get(event["type"])
        self.sink.add(take(self, event) if take is not None else event)

    def _started_take(self, event: StartedEvent) -> StartedEvent:
        self.started_event = event
        machines = event.get("machines")
        if self.multinode:  # only this machine's ranks: another's PIDs are strangers here
            self.rank_pids = pids_on_machine(
                pids=event.get("pids"), machines=machines, machine=self.machine
            )
        else:
            self.rank_pids = [int(p) for p in event.get("pids") or [] if isinstance(p, int)]
        if self.multinode and isinstance(machines, list):
            self.rank_machines = [str(m) for m in machines]
            rank_machines_store(experiment=self.experiment, machines=self.rank_machines)
        # Samples share the training's clock (seconds since it started), not this process's.
        self.clock_zero = time.monotonic() - float(event.get("time") or 0)
        return event

    def _log_take(self, event: LogEvent) -> LogEvent:
        self.echoes.heard(str(event.get("message", "")))
        # Rank 0 alone writes events: its log messages are kept as rank 0's (their stderr copy
        # is dropped as an echo), so that filtering the log by rank 0 finds them.
        tagged = {**event, "rank": 0, **({"machine": self.machine} if self.machine else {})}
        return cast(LogEvent, tagged)

    def _figures_take(self, event: StepEvent | EpochEvent) -> StepEvent | EpochEvent:
        """Each rank's figures tagged with the machine it ran on (several machines only)."""
        ranks = event.get("ranks")
        if not self.rank_machines or not isinstance(ranks, list):
            return event
        tagged = [
            {**row, "machine": self.rank_machines[row["rank"]]}
            if isinstance(row, dict) and row.get("rank") in range(len(self.rank_machines))
            else row
            for row in ranks
        ]
        return cast(StepEvent | EpochEvent, {**event, "ranks": tagged})

    def _checkpoint_take(self, event: CheckpointEvent) -> CheckpointEvent:
        if event.get("answers_request") is True:
            self._checkpoint_request_answered()
        return event

    def _final_take(self, event: FinishedEvent | FailedEvent) -> LogBody:
        self.final_event = dict(event)  # read with .get: its fields are the training's word
        # Ended by the Stop it was asked for: no failure to report, nor its traceback.
        stopped = event["type"] == "failed" and self.stopped_by is not None
        if event["type"] == "failed" and event.get("traceback") and not stopped:
            self.sink.add_output(str(event["traceback"]), level="error")
        # The final status is the dashboard's to say, once the process has exited.
        level = "error" if event["type"] == "failed" and not stopped else "info"
        message = (
            f"training stopped, as {self.stopped_by} asked" if stopped else _final_message(event)
        )
        return {"type": "log", "level": level, "message": message}

    # What the supervisor does with each type of event before the sink gets it (a type not here
    # goes to the sink as it came); returns what the sink gets.
    TAKE: ClassVar[dict[str, Callable[[RunSupervisor, Any], Event | LogBody]]] = {
        "started": _started_take,
        "step": _figures_take,
        "epoch": _figures_take,
        "log": _log_take,
        "checkpoint": _checkpoint_take,
        "finished": _final_take,
        "failed": _final_take,
    }

    def _stderr_release(self, lines: list[str]) -> None:
        # After a Stop, the launcher's signal tracebacks are expected noise, not news.
        for line in lines:
            if not line.strip() or self.stopped_by is not None:
                continue
            # A training log line is kept as its message, with the rank and level that wrote it
            # (the run page filters by them); any other line as it came.
            read = log_line_read(line)
            if read is None:
                self.sink.add_output(line, level="stderr", machine=self.machine)
            else:
                self.sink.add_output(
                    read.message, level=read.level or "stderr", rank=read.rank, machine=self.machine
                )

    def _check_requests(self, process: subprocess.Popen[str]) -> None:
        """What the run's row asks of this run: a stop, a checkpoint (one query for both)."""
        row = (
            Experiment.objects.filter(pk=self.experiment.pk)
            .values(
                "cancel_requested_at",
                "cancelled_by__username",
                "checkpoint_requested_at",
                "checkpoint_requested_by__username",
            )
            .first()
        )
        if row is None:
            return
        if row["cancel_requested_at"] is not None:
            self._stop(process, by=row["cancelled_by__username"] or "someone")
        elif row["checkpoint_requested_at"] not in (None, self.checkpoint_signalled):
            self._checkpoint_request_pass(
                process,
                requested_at=row["checkpoint_requested_at"],
                by=row["checkpoint_requested_by__username"] or "someone",
            )

    def _checkpoint_request_pass(
        self, process: subprocess.Popen[str], *, requested_at: datetime, by: str
    ) -> None:
        """Signal the process the training named for requests; wait while it has not started.

        The request stays on the row, so that a page shows it pending, until the training's
        checkpoint event answers it (``_checkpoint_request_answered``); asking again meanwhile
        is the same request."""
        if self.started_event is None:
            return
        pid = self.started_event.get("requests_pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            self._checkpoint_request_drop(
                requested_at,
                f"Checkpoint requested by {by}, but this training does not take requests (its "
                "started event names no requests_pid); it writes one each epoch.",
            )
        elif process_in_tree_signal(root_pid=process.pid, pid=pid, signum=signal.SIGUSR1):
            self.checkpoint_signalled = requested_at
            self.sink.add_output(
                f"Checkpoint requested by {by}; the training writes it after its current step.",
                level="info",
            )
        else:
            self._checkpoint_request_drop(
                requested_at, f"Checkpoint requested by {by}, but the training has ended."
            )

    def _checkpoint_request_answered(self) -> None:
        if self.checkpoint_signalled is None:
            return
        # Conditional: a request made after the signal was sent is a new one, for the next poll.
        Experiment.objects.filter(
            pk=self.experiment.pk, checkpoint_requested_at__lte=self.checkpoint_signalled
        ).update(checkpoint_requested_at=None, checkpoint_requested_by=None)
        self.checkpoint_signalled = None

    def _checkpoint_request_drop(self, requested_at: datetime, reason: str) -> None:
        Experiment.objects.filter(
            pk=self.experiment.pk, checkpoint_requested_at=requested_at
        ).update(checkpoint_requested_at=None, checkpoint_requested_by=None)
        self.sink.add_output(reason, level="warning")

    def _training_finished(self) -> bool:
        return (self.final_event or {}).get("type") == "finished"

    def _stop(self, process: subprocess.Popen[str], *, by: str) -> None:
        self.stopped_by = by
        if self._training_finished():
            # The ranks are only tearing down (seconds for torchrun): ending them loses nothing.
            message = f"Stop requested by {by} after the training had finished; its results stand"
        else:
            message = f"Stop requested by {by}; ending every process"
        self.sink.add_output(message, level="info")
        self.sink.flush()
        killed = process_tree_stop(
            root_pid=process.pid,
            extra_pids=self.rank_pids,
            grace_seconds=settings.TRAINYARD_STOP_GRACE_SECONDS,
        )
        if killed:
            self.sink.add_output(f"killed after the grace period: {killed}", level="warning")

    def _outcome(self, returncode: int) -> Outcome:
        final = self.final_event or {}
        # A finished event comes after the last evaluation and checkpoint: a Stop (or any end)
        # after it only cut the teardown short, and must not throw the results away.
        if final.get("type") == "finished" and (returncode == 0 or self.stopped_by is not None):
            return Outcome(
                Status.SUCCEEDED,
                test_loss=final.get("test_loss"),
                test_accuracy=final.get("test_accuracy"),
            )
        if self.stopped_by is not None:
            return Outcome(Status.CANCELLED, error=f"Stopped by {self.stopped_by}.")
        if final.get("type") == "failed":
            return Outcome(Status.FAILED, error=str(final.get("error") or "training failed"))
        tail = "\n".join(self.stderr_tail)
        if returncode < 0 or returncode in {128 + signal.SIGTERM, 128 + signal.SIGKILL}:
            number = -returncode if returncode < 0 else returncode - 128
            reason = (
                f"training was ended by {signal.Signals(number).name} from outside the dashboard "
                "(a worker shutting down ends its runs)"
            )
            return Outcome(Status.FAILED, error=f"{reason}\n{tail}")
        return Outcome(Status.FAILED, error=f"training exited with code {returncode}\n{tail}")


class StderrEchoes:
    """Rank 0 writes each of its log messages twice: to stderr for a person at a shell, and as a
    ``log`` event. The run's log keeps the event; the stderr copy is dropped.

    The two come through separate pipes in either order, so one of the training's log lines
    (marked as ``training/protocol.py`` documents) is held for up to ``HOLD_SECONDS``: dropped if
    the event with its message comes, else shown after all (a message only stderr has, or
    another rank's). Lines behind a held one wait with it, so that stderr keeps its order.

    Only rank 0's lines can be echoes: every rank logs the same warnings (each loads the data),
    and rank 1's copy of a message rank 0 sent as an event is rank 1's own line, kept."""

    HOLD_SECONDS = 1.0

    def __init__(self) -> None:
        # (since, the message an event would carry if the line may be its echo, line)
        self.held: deque[tuple[float, str | None, str]] = deque()
        self.events: deque[str] = deque(maxlen=200)  # recent log events' messages

    def hold(self, line: str, *, now: float) -> None:
        read = log_line_read(line)
        if read is None:
            self.held.append((now, None, line))
            return
        echo = read.message if read.rank in (0, None) else None
        if echo is not None and echo in self.events:
            return  # the echo of an event already stored
        self.held.append((now, echo, line))

    def heard(self, message: str) -> None:
        message = message.strip()
        self.events.append(message)
        self.held = deque(h for h in self.held if h[1] is None or h[1] != message)

    def release(self, now: float) -> list[str]:
        """The lines to show now, in stderr's order: from the front, those not waiting for an
        echo, or waiting longer than ``HOLD_SECONDS``."""
        shown = []
        while self.held and (self.held[0][1] is None or now - self.held[0][0] >= self.HOLD_SECONDS):
            shown.append(self.held.popleft()[2])
        return shown


def _final_message(event: FinishedEvent | FailedEvent) -> str:
    if event["type"] == "finished":
        accuracy = event.get("test_accuracy")
        shown = f"{accuracy:.2%}" if isinstance(accuracy, float) else "n/a"
        return f"training finished: test accuracy {shown}, test loss {event.get('test_loss')}"
    return f"training failed: {event.get('error')}"


def experiments_stop_for_worker_shutdown(*, worker: str) -> list[int]:
    """End the process trees of the runs this worker supervises; returns their ids."""
    rows = Experiment.objects.filter(status=Status.RUNNING, worker=worker).exclude(
        launcher_pid=None
    )
    ended = []
    for experiment in rows:
        info = experiment.run_info or {}
        pids = (
            pids_on_machine(pids=info.get("pids"), machines=info.get("machines"), machine=worker)
            if experiment.nodes > 1
            else [int(p) for p in info.get("pids") or [] if isinstance(p, int)]
        )
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
