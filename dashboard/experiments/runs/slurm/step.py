"""The training inside a Slurm job: one `srun` step over every node of the allocation, and the
signals the scheduler sends the job's supervisor (runs/executor.py's Executor, for Slurm).

srun starts one task a node, each the same `python -m training ... --nnodes N`, which becomes
torchrun there (c10d rendezvous hosted on the first node, at its NodeAddr: node names need not
resolve). srun hands back every task's stdout and stderr, so this one supervisor reads the events
of rank 0 wherever torchrun's rendezvous put it, and every rank's log lines, and every other
node's machine samples (node_sampler.py's lines, taken out of the training's output here).

The ranks run under slurmstepd on their nodes, not under this process: they are reached through
the scheduler. A request (SIGUSR1: a checkpoint, SIGUSR2: a profile, SIGTERM: a script's agreed
Stop) goes to the one process the training named, on its node (the `started` event's machine of
that rank), by a step of its own running kill there; a Stop is `scancel --signal=TERM` to every
process of the job's steps (torchrun passes it to its ranks), then, after the grace, the srun
client is ended here (which ends the step).

sbatch's warning (`--signal=B:USR1@N`, before the time limit or a preemption) reaches this
process only (the batch shell execs it): the supervisor asks for a checkpoint, waits for it, and
ends the step to resume; the job then requeues itself (job.py). A SIGTERM to the batch shell is
the scheduler ending the job (scancel, `scontrol requeue`, a preemption): the ranks get it too;
the run is left to the reconciler, or to this job's next start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from subprocess import Popen
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.nodes import rendezvous_id
from dashboard.experiments.runs.process import TrainingProcess, training_popen
from dashboard.experiments.runs.processes import process_tree_stop
from dashboard.experiments.runs.runner import sample_interval
from dashboard.experiments.runs.slurm.node_sampler import node_sampler_command, node_samples_parse
from dashboard.experiments.runs.slurm.rejoin import TaskLines
from dashboard.experiments.scheduling.slurm.commands import SlurmError
from dashboard.experiments.scheduling.slurm.jobs import (
    slurm_job_cancel,
    slurm_signal_on_node,
    srun_command,
)
from dashboard.experiments.scheduling.slurm.parse import SlurmNode
from dashboard.serving import free_port
from training.process.tree import OutputLine

if TYPE_CHECKING:
    from dashboard.experiments.runs.runner import RunSupervisor

log = logging.getLogger(__name__)

# After sbatch's warning, how long the training's checkpoint may take before the step is ended
# anyway: within the warning's time, with some left for the requeue.
WARNING_CHECKPOINT_SHARE = 0.5
STOPPED_BY_WARNING = "Slurm's warning (SIGUSR1: the time limit or a preemption is near)"


class SlurmStepProcess(TrainingProcess):
    """The local srun client of the training's step; its processes reached through Slurm."""

    def __init__(self, popen: Popen[str], *, job_id: str, nodes: list[SlurmNode]) -> None:
        super().__init__(popen)
        self.job_id = job_id
        self.nodes = nodes
        # The training's `started` event (the executor's turn hands it on): each rank's PID and
        # host, to find the node of the process a request goes to.
        self.started: Mapping[str, Any] | None = None
        # The other nodes' machine samples, as their lines came (the executor's turn adds them).
        self.samples: list[dict[str, float]] = []
        # srun's labelled pieces, joined into each task's lines, per stream (a long line comes
        # cut, other nodes' lines between its pieces), and the whole ones not yet read.
        self.streams = {"stdout": TaskLines(), "stderr": TaskLines()}
        self.whole: deque[OutputLine] = deque()

    def line_next(self, timeout: float) -> OutputLine:
        """The training's next line, whole; a node's samples are kept apart (and read as no
        line), and so is a piece of a cut line."""
        if not self.whole:
            source, line = super().line_next(timeout)
            stream = self.streams.get(source)
            if stream is None:  # none came within `timeout`
                return source, line
            self.whole.extend((source, whole) for whole in stream.take(line))
            if not self.whole:  # a piece, held
                return "", ""
        source, line = self.whole.popleft()
        names = [node.name for node in self.nodes]
        samples = node_samples_parse(line, nodes=names) if source == "stderr" and line else None
        if samples is None:
            return source, line
        if samples:
            self.samples.append(samples)
        return "", ""

    def samples_take(self) -> list[dict[str, float]]:
        taken, self.samples = self.samples, []
        return taken

    def stop(self, *, rank_pids: list[int], grace_seconds: float) -> list[int]:
        """SIGTERM to every process of the step (torchrun passes it to its ranks: they stop as
        on a worker), wait, then end the srun client, which ends what is left of the step.
        `rank_pids` are other nodes' PIDs as often as not: never signalled from here."""
        if self.popen.poll() is None:
            try:
                slurm_job_cancel(self.job_id, signal="TERM", here=True)
            except SlurmError as exc:
                log.warning("job %s: SIGTERM to its step failed: %s", self.job_id, exc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_seconds)
        return process_tree_stop(root_pid=self.pid, extra_pids=[], grace_seconds=grace_seconds)

    def signal_in_tree(self, *, pid: int, signum: int) -> bool:
        """Signal `pid` on its node; False when the step has ended, or the signal failed (the
        process is gone)."""
        if self.popen.poll() is not None:
            return False
        name = signal.Signals(signum).name.removeprefix("SIG")
        node = process_node(started=self.started, pid=pid, nodes=self.nodes)
        try:
            slurm_signal_on_node(self.job_id, node=node, pid=pid, signal=name)
        except SlurmError as exc:
            log.warning("job %s: SIG%s to %s failed: %s", self.job_id, name, pid, exc)
            return False
        return True


class SlurmStep:
    """The Executor of a run's attempt in Slurm job `job_id` on `nodes` (the allocation's)."""

    def __init__(
        self, *, job_id: str, warning_seconds: float, nodes: list[SlurmNode] | None = None
    ) -> None:
        self.job_id = job_id
        self.nodes = nodes or []  # the job's supervisor sets them after its signals (job.py)
        self.warning_seconds = warning_seconds
        self.warned_at: float | None = None  # sbatch's SIGUSR1, by this process's clock
        self.checkpoint_asked = False
        self.terminated = False  # the scheduler's SIGTERM
        self.ended = False  # the step ended once for the SIGTERM

    def signals_install(self) -> None:
        """sbatch's warning and the scheduler's SIGTERM, both to this process: the handlers only
        note them; the supervisor's loop acts (turn)."""
        signal.signal(signal.SIGUSR1, lambda signum, frame: self._warned())
        signal.signal(signal.SIGTERM, lambda signum, frame: self._terminated())

    def _warned(self) -> None:
        self.warned_at = self.warned_at or time.monotonic()

    def _terminated(self) -> None:
        self.terminated = True

    def rendezvous_flags(self, *, experiment: Experiment) -> list[str]:
        """The c10d store on the first node (where this supervisor runs: the batch host), at its
        NodeAddr and a port free here."""
        return [
            "--nnodes", str(len(self.nodes)),
            "--rdzv-endpoint", f"{self.nodes[0].address}:{free_port()}",
            "--rdzv-id", rendezvous_id(experiment),
        ]  # fmt: skip

    def start(
        self, *, command: list[str], tail: list[str], env: dict[str, str], cwd: Path | str
    ) -> TrainingProcess:
        # The other nodes' samples, as often as the supervisor takes its own (runner.py).
        sampler = node_sampler_command(python=sys.executable, interval=sample_interval())
        srun = srun_command(nodes=len(self.nodes), cwd=cwd, command=command, tail=tail,
                            sampler=sampler)  # fmt: skip
        # A piece may end inside a character: its bytes, kept, are decoded once joined.
        popen = training_popen(command=srun, env={**env, **slurm_environment()}, cwd=cwd,
                               errors="surrogateescape")  # fmt: skip
        return SlurmStepProcess(popen, job_id=self.job_id, nodes=self.nodes)

    def ended_outside(self) -> bool:
        return self.terminated

    def turn(self, *, supervisor: RunSupervisor, now: float) -> None:
        process, requests, state = supervisor.process, supervisor.requests, supervisor.state
        if process is None or requests is None:
            return
        if isinstance(process, SlurmStepProcess):
            process.started = state.started_event
            for samples in process.samples_take():
                supervisor.sink.add_series(samples, time_=round(now - supervisor.clock_zero, 3))
        if self.terminated and not self.ended:
            self.ended = True
            supervisor.sink.add_output(
                f"Slurm ended job {self.job_id} (a cancel, a requeue or a preemption); its "
                "processes are ending, and the run follows the job",
                level="warning",
            )
            process.stop(rank_pids=[], grace_seconds=2)
            return
        if self.warned_at is None or state.stopped_by is not None or self.terminated:
            return
        if not self.checkpoint_asked:
            self.checkpoint_asked = True
            requests.checkpoint_request_pass(requested_at=timezone.now(), by=STOPPED_BY_WARNING)
            return
        waited = now - self.warned_at
        bound = self.warning_seconds * WARNING_CHECKPOINT_SHARE
        if state.checkpoint_signalled is None or waited > bound:
            # The checkpoint is written (or none could be): end this attempt to resume from it.
            state.resuming = True
            requests.stop(by=STOPPED_BY_WARNING)


def slurm_environment() -> dict[str, str]:
    """The job's own SLURM_* variables (its id, its steps', the site's SLURM_CONF): srun needs
    them to start its step inside this allocation, and a script run's environment
    (scripts/environment.py's allowlist) leaves them out. They describe the job, not a secret.
    Not SLURM_UNBUFFEREDIO (srun's --unbuffered): its pieces could not be joined (rejoin.py)."""
    return {name: value for name, value in os.environ.items()
            if name.startswith("SLURM_") and name != "SLURM_UNBUFFEREDIO"}  # fmt: skip


def process_node(*, started: Mapping[str, Any] | None, pid: int, nodes: list[SlurmNode]) -> str:
    """The node `pid` runs on: its rank's host in `started` (a script's launcher, which names
    itself, is on rank 0's), matched to a node's host name or name; else the first node."""
    started = started or {}
    pids, machines = started.get("pids"), started.get("machines")
    host = None
    if isinstance(pids, list) and isinstance(machines, list) and machines:
        host = machines[pids.index(pid)] if pid in pids[: len(machines)] else machines[0]
    found = [n.name for n in nodes if host is not None and host in (n.hostname, n.name)]
    return found[0] if found else nodes[0].name
