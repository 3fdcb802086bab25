"""A Slurm cluster of two nodes on this host for tests: munge, slurmctld and two slurmd (`n1`,
`n2`), each a process of ours on free ports, with slurm.conf written at run time in a folder of
its own (PITFALLS.md, "Slurm on one host"). Every Slurm command finds it through SLURM_CONF.

Run as root without systemd: no cgroups (proctrack/linuxproc, task/none), one CPU a node, ended
jobs kept in `squeue -t all` for ten minutes (no slurmdbd, so no sacct). The daemons are ended
by their PIDs; what a job left behind is found by this cluster's SLURM_CONF in its environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from dashboard.serving import free_port, wait_for

# The daemons (from slurmctld, slurmd and munge) and the commands (slurm-client).
SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel")
NODES = ("n1", "n2")
# Tighter than the defaults, for a test's patience: a requeued job may start again after
# cred_expire (PITFALLS), the scheduler looks at pending jobs every 2 s (60 by default), and a
# job's processes get 5 s between SIGTERM and SIGKILL (30).
SLURM_CONF = """\
ClusterName=ty{tag}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={home}/munge/munge.sock,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={home}/state
SlurmdSpoolDir={home}/spool-%n
SlurmctldPidFile={home}/slurmctld.pid
SlurmdPidFile={home}/slurmd-%n.pid
SlurmctldLogFile={home}/slurmctld.log
SlurmdLogFile={home}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1_port} CPUs=1
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2_port} CPUs=1
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=60 State=UP
"""


def slurm_missing() -> list[str]:
    """The programs of the cluster not on this PATH (their packages: .ci/system-packages)."""
    return [name for name in SLURM_PROGRAMS if shutil.which(name) is None]


@dataclass
class SlurmCluster:
    home: Path
    conf: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this cluster with the Slurm commands."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *command: str, check: bool = True) -> str:
        done = subprocess.run(  # noqa: S603
            list(command), env={**os.environ, **self.env}, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> dict[str, tuple[str, str, str]]:
        """Every job the controller still knows: id -> (name, state, reason)."""
        found = {}
        for line in self.run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r").splitlines():
            job_id, name, state, reason = line.split("|", 3)
            found[job_id] = (name, state, reason)
        return found

    def log_tail(self, lines: int = 30) -> str:
        tails = []
        for path in sorted(self.home.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(tails)

    def left_behind(self, *, jobs_only: bool = True) -> list[psutil.Process]:
        """Processes of this cluster's jobs still alive: a job's id and this cluster's
        SLURM_CONF in their environment (a client of the cluster has only the latter, and so
        has a slurmstepd, which its slurmd started: `jobs_only=False` finds them too). Never
        this process, nor one of the cluster's daemons."""
        ours = {os.getpid(), *(p.pid for p in self.processes.values() if p.poll() is None)}
        found = []
        for process in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                env = process.environ()
                if (process.pid not in ours and env.get("SLURM_CONF") == str(self.conf)
                        and (not jobs_only or "SLURM_JOB_ID" in env)):  # fmt: skip
                    found.append(process)
        return found


def _start(cluster: SlurmCluster, name: str, command: list[str]) -> None:
    log = (cluster.home / f"{name}.out").open("wb")
    cluster.processes[name] = subprocess.Popen(  # noqa: S603
        command, env={**os.environ, **cluster.env}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _nodes_idle(cluster: SlurmCluster) -> bool:
    out = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
    states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    return all(states.get(node) == "idle" for node in NODES)


@contextlib.contextmanager
def slurm_cluster_running(*, home: Path) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd n1 and n2 under `home`, until the block ends; then every job
    is cancelled and each daemon, and anything a job left, is ended by its PID."""
    (home / "munge").mkdir(parents=True)
    (home / "state").mkdir()
    key = home / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    host = socket.gethostname().split(".")[0]  # slurmd knows itself by its short name
    conf = home / "slurm.conf"
    conf.write_text(SLURM_CONF.format(
        tag=os.getpid(), host=host, home=home, ctld_port=free_port(), n1_port=free_port(),
        n2_port=free_port(),
    ))  # fmt: skip
    cluster = SlurmCluster(home=home, conf=conf)
    munge = home / "munge"
    try:
        _start(cluster, "munged", [
            "munged", "-F", "--force", f"--key-file={key}", f"--socket={munge}/munge.sock",
            f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed",
        ])  # fmt: skip
        wait_for(lambda: (munge / "munge.sock").exists(), timeout=10, what="munged's socket")
        _start(cluster, "slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])
        for node in NODES:
            _start(cluster, f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(conf)])
        try:
            wait_for(lambda: _nodes_idle(cluster), timeout=30, what="n1 and n2 idle",
                     interval=0.3)  # fmt: skip
        except TimeoutError:
            raise RuntimeError(cluster.log_tail()) from None
        yield cluster
    finally:
        slurm_cluster_end(cluster)


def slurm_cluster_end(cluster: SlurmCluster) -> None:
    """Cancel every job, wait for their processes, then end the daemons by PID."""
    if "slurmctld" in cluster.processes:
        with contextlib.suppress(Exception):
            for job_id in cluster.jobs():
                cluster.run("scancel", job_id, check=False)
            deadline = time.monotonic() + 15
            while cluster.left_behind() and time.monotonic() < deadline:
                time.sleep(0.2)
    for process in cluster.left_behind():
        with contextlib.suppress(psutil.Error):
            process.kill()
    for process in reversed(cluster.processes.values()):  # slurmd first, munged last
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in cluster.processes.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # What outlives its daemons: a slurmstepd (its slurmd's child, in a session of its own) of a
    # job that would not end, an srun client; each by its PID.
    for process in cluster.left_behind(jobs_only=False):
        with contextlib.suppress(psutil.Error):
            process.kill()
