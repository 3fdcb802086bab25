"""A run as a Slurm batch job: what it asks for, its script, and the commands over it (submit,
list, cancel, requeue) and over the cluster (partitions, nodes). An adapter over the
scheduler's own commands, as TorchX's slurm_scheduler.py and submitit are: one job per run,
named `ty-<run id>`, its state read back by polling (runs/slurm/reconcile.py).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings

from dashboard.experiments.scheduling.job_command import JOB_PREFIX, job_command, job_name
from dashboard.experiments.scheduling.queue import PRIORITY_RANGE
from dashboard.experiments.scheduling.slurm.commands import SlurmError, slurm_run
from dashboard.experiments.scheduling.slurm.parse import (
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    Partition,
    SlurmJob,
    SlurmNode,
    scontrol_nodes_parse,
    sinfo_parse,
    squeue_parse,
)

# What sbatch --parsable answers: the job's id, then ";cluster" on a federation.
JOB_ID = re.compile(r"\d+")
# The pages' questions (the launch form's and launch checks' partitions, the device page's nodes
# and jobs) are answered from this process's last answer this long: each is a command (over
# ssh, a connection) and a call on slurmctld, once per page load otherwise. The reconciler and a
# job's supervisor always ask afresh.
FACTS_SECONDS = 5.0
_facts: dict[tuple[str, ...], tuple[float, Any]] = {}
T = TypeVar("T")


def job_run_id(name: str) -> int | None:
    """The run a job's name says (`ty-12`: 12); None for another name."""
    run_id = name.removeprefix(JOB_PREFIX)
    return int(run_id) if name.startswith(JOB_PREFIX) and run_id.isdigit() else None


@dataclass(frozen=True)
class JobRequest:
    """What one run's job asks of the cluster."""

    experiment_id: int
    nodes: int
    ranks_per_node: int  # a CPU core each
    gpus_per_node: int
    partition: str  # "": TRAINYARD_SLURM_PARTITION, else the cluster's default
    time_limit_minutes: int | None  # None: the partition's
    log: Path  # the supervisor's own output (its log lines; the training's go to the run)
    priority: int = 0  # the run's, on Trainyard's scale (queue.PRIORITY_RANGE): its --nice


def priority_nice(priority: int) -> int:
    """sbatch's --nice for a run's priority: a run at the default or above is 0, as a bare
    sbatch's job (so Trainyard's jobs never queue behind the same user's own for being
    Trainyard's), and a lowered one its distance below (priority -300: nice 300). Never
    negative: Slurm takes a negative nice (a raised priority) from its administrators only, and
    refuses the job of anyone else; nor does one user's raised run pass other users' jobs, as
    on the workers' queue, where priority orders a user's own runs only (scheduling/fair.py)."""
    low, _high = PRIORITY_RANGE
    return -min(0, max(low, priority))


def site_sets_nice() -> bool:
    """The site's TRAINYARD_SLURM_SBATCH_ARGS give every job its nice: theirs wins, at
    submission and after."""
    return any(
        word == "--nice" or word.startswith("--nice=")
        for word in shlex.split(settings.TRAINYARD_SLURM_SBATCH_ARGS)
    )


def sbatch_args(request: JobRequest) -> list[str]:
    """sbatch's options: one task a node (the supervisor's srun starts torchrun on each, which
    starts the node's ranks), requeued rather than ended when preempted or requeued, and SIGUSR1
    to the batch shell (the supervisor) TRAINYARD_SLURM_SIGNAL_SECONDS before the time limit."""
    warning = warning_seconds(time_limit_minutes=request.time_limit_minutes)
    args = [
        "sbatch", "--parsable", f"--job-name={job_name(request.experiment_id)}",
        f"--nodes={request.nodes}", "--ntasks-per-node=1",
        f"--cpus-per-task={max(1, request.ranks_per_node)}",
        "--requeue", f"--signal=B:USR1@{warning}",
        f"--output={request.log}", f"--chdir={settings.BASE_DIR}",
    ]  # fmt: skip
    partition = request.partition or settings.TRAINYARD_SLURM_PARTITION
    if partition:
        args.append(f"--partition={partition}")
    if request.time_limit_minutes:
        args.append(f"--time={request.time_limit_minutes}")
    if request.gpus_per_node:
        args.append(f"--gres=gpu:{request.gpus_per_node}")
    # Policy stays Trainyard's: the run's priority as its nice, the site's QoS where one is set
    # (TRAINYARD_SLURM_SBATCH_ARGS come last, so a site's own --nice or --qos wins).
    args.append(f"--nice={priority_nice(request.priority)}")
    if settings.TRAINYARD_SLURM_QOS:
        args.append(f"--qos={settings.TRAINYARD_SLURM_QOS}")
    return args + shlex.split(settings.TRAINYARD_SLURM_SBATCH_ARGS)


def warning_seconds(*, time_limit_minutes: int | None) -> int:
    """How long before the time limit sbatch's warning comes: TRAINYARD_SLURM_SIGNAL_SECONDS, or
    half the run's own limit where that is shorter. A warning as long as the limit would come
    at the job's start, every start: a checkpoint and a requeue forever, no step between."""
    warning = settings.TRAINYARD_SLURM_SIGNAL_SECONDS
    if time_limit_minutes:
        warning = min(warning, time_limit_minutes * 60 // 2)
    return max(1, warning)


def batch_script(*, experiment_id: int) -> str:
    """The job's script: exec, so that the supervisor is the batch shell and gets sbatch's
    `B:` signals itself (torchrun would die of a SIGUSR1 sent to every process: PITFALLS.md).
    SIGUSR1 is ignored until the supervisor takes it (runs/slurm/job.py): a warning that comes
    while Python and Django start (a short time limit, a preemption) must not kill it, which
    is SIGUSR1's default; an ignored signal stays ignored across exec.
    The compute nodes need this checkout and interpreter at the same paths (README)."""
    command = job_command(experiment_id=experiment_id, python=sys.executable,
                          manage=str(Path(settings.BASE_DIR) / "manage.py"))  # fmt: skip
    return (
        "#!/bin/bash\n"
        f"# Trainyard run {experiment_id}: its supervisor, which starts the training on every\n"
        "# node of this allocation with srun and reports to the dashboard.\n"
        "trap '' USR1\n"
        f"exec {shlex.join(command)}\n"
    )


# The node's sampler first (its argv; its count first, 0 for none), started in the background on
# every node but the first (whose machine the supervisor samples itself) with the PID that
# becomes the training's, so that it ends with it (runs/slurm/node_sampler.py). Then, on the
# first node only, --rdzv-host (torchrun's is_host): the training's flags before a script's
# "--", then the rest, their count first.
# A run's --gpus become the GPUs Slurm gave the node (the step's CUDA_VISIBLE_DEVICES, from the
# job's --gres): the run asked for a count, and the ids it was launched with may be another
# job's there. Slurm's variable goes, so that the training counts the node's GPUs and narrows
# to those ids itself, as on a worker (where the cgroup hides the others, Slurm's ids are 0..).
NODE_SHELL = (
    'sampler=("${@:2:$1}"); shift "$(($1 + 1))"; '
    'head=("${@:2:$1}"); tail=("${@:$(($1 + 2))}"); taken=; '
    '[ "$SLURM_NODEID" = 0 ] && head+=(--rdzv-host); '
    'for i in "${!head[@]}"; do '
    'if [ "${head[$i]}" = --gpus ] && [ -n "$CUDA_VISIBLE_DEVICES" ]; then '
    "head[$((i + 1))]=$CUDA_VISIBLE_DEVICES; taken=1; fi; done; "
    '[ -n "$taken" ] && unset CUDA_VISIBLE_DEVICES; '
    'if [ "$SLURM_NODEID" != 0 ] && [ "${#sampler[@]}" -gt 0 ]; then '
    '"${sampler[@]}" --parent "$$" > /dev/null & fi; '
    'exec "${head[@]}" "${tail[@]}"'
)


def srun_command(
    *, nodes: int, cwd: Path | str, command: list[str], tail: list[str],
    sampler: list[str] | None = None,
) -> list[str]:  # fmt: skip
    """One srun step over the allocation's `nodes`, a task each running `command` (+ `tail`),
    the first node's with --rdzv-host, the others beside `sampler` (NODE_SHELL); a task that
    fails ends the step. --label: each piece of a long line srun relays comes as a line led by
    its task's number, to join them again (runs/slurm/rejoin.py)."""
    sampler = sampler or []
    return [
        "srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label",
        f"--chdir={cwd}", "bash", "-c", NODE_SHELL, "trainyard-node",
        str(len(sampler)), *sampler, str(len(command)), *command, *tail,
    ]  # fmt: skip


def slurm_job_submit(request: JobRequest) -> str:
    """sbatch the run's job; its id (SlurmError where sbatch refused it)."""
    request.log.parent.mkdir(parents=True, exist_ok=True)
    out = slurm_run(sbatch_args(request), stdin=batch_script(experiment_id=request.experiment_id))
    job_id = out.strip().split(";", 1)[0]  # "123", or "123;cluster" on a federation
    if not JOB_ID.fullmatch(job_id):
        # A job may have been queued all the same: its ty-* name lets the reconciler end it.
        raise SlurmError(f"sbatch answered no job id: {out.strip()[:200]!r}")
    return job_id


def slurm_jobs() -> dict[str, SlurmJob]:
    """Every job of ours the controller knows, ended ones too while it keeps them (MinJobAge),
    by id: this account's (--me) ty-* jobs. Another user's job of the same name is not ours to
    mirror, nor to cancel as a stray."""
    out = slurm_run(["squeue", "--me", "-h", "-t", "all", "-o", SQUEUE_FORMAT])
    return {job.job_id: job for job in squeue_parse(out) if job.name.startswith(JOB_PREFIX)}


def slurm_jobs_cached() -> dict[str, SlurmJob]:
    """slurm_jobs for a page (FACTS_SECONDS old at most)."""
    return slurm_facts_cached("jobs", slurm_jobs)


def slurm_facts_cached(name: str, read: Callable[[], T]) -> T:
    """`read()`, or its answer of less than FACTS_SECONDS ago in this process, for this cluster
    (a login node, a SLURM_CONF of its own: a test's). A failure is not kept."""
    key = (name, settings.TRAINYARD_SLURM_SSH, os.environ.get("SLURM_CONF", ""),
           os.environ.get("PATH", ""))  # fmt: skip
    now = time.monotonic()
    held = _facts.get(key)
    if held is not None and now - held[0] < FACTS_SECONDS:
        return held[1]
    found = read()
    _facts[key] = (now, found)
    return found


def slurm_job_cancel(job_id: str, *, signal: str = "", here: bool = False) -> None:
    """scancel the job; with `signal`, send it to every process of the job's steps instead (not
    to the batch shell: scancel's default for any signal but KILL)."""
    flags = [f"--signal={signal}"] if signal else []
    slurm_run(["scancel", *flags, job_id], here=here)


def slurm_job_renice(job_id: str, *, priority: int) -> None:
    """A pending job's nice set anew for its run's priority (one a user may set: never
    negative); none where the site's own --nice rules every job."""
    if site_sets_nice():
        return
    slurm_run(["scontrol", "update", f"JobId={job_id}", f"Nice={priority_nice(priority)}"])


def slurm_job_requeue(job_id: str) -> None:
    """Put the job back in the queue from inside it: it ends now and starts again (the run's
    next attempt) once nodes are free."""
    slurm_run(["scontrol", "requeue", job_id], here=True)


def slurm_partitions() -> list[Partition]:
    """The cluster's partitions (sinfo), for the launch form and its checks: FACTS_SECONDS old
    at most."""
    return slurm_facts_cached(
        "partitions", lambda: sinfo_parse(slurm_run(["sinfo", "-h", "-o", SINFO_FORMAT]))
    )


def slurm_cluster_nodes() -> list[SlurmNode]:
    """Every node of the cluster, as `scontrol show node` says it (the device page: FACTS_SECONDS
    old at most)."""
    return slurm_facts_cached(
        "nodes", lambda: scontrol_nodes_parse(slurm_run(["scontrol", "show", "node", "-o"]))
    )


def slurm_nodes(nodelist: str, *, here: bool = False) -> list[SlurmNode]:
    """The nodes of a node list ("n[1-2]") in its order, with their addresses."""
    names = slurm_run(["scontrol", "show", "hostnames", nodelist], here=here).split()
    found = {n.name: n for n in scontrol_nodes_parse(
        slurm_run(["scontrol", "show", "node", "-o", ",".join(names)], here=here)
    )}  # fmt: skip
    return [found.get(name) or SlurmNode(name, name, 0, 0, "", name) for name in names]


def slurm_signal_on_node(job_id: str, *, node: str, pid: int, signal: str) -> None:
    """Signal one process of the job on one of its nodes, from inside the job: a step of its
    own (`--overlap`: the training's holds every CPU) running kill there."""
    slurm_run(
        ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1",
         f"--nodelist={node}", "kill", "-s", signal, str(pid)],
        here=True,
    )  # fmt: skip
