"""Launch to first point of a DDP run over two Slurm nodes: through Trainyard, and as a bare
`sbatch` of the same training, side by side on this host's two-node cluster
(tests/slurm_cluster.py; needs Debian's slurm-wlm and munge, and root):

    .venv/bin/python -m tests.bench_slurm [rounds]

A bare job runs `srun` of the same `python -m training` command with the same rendezvous (what
the run's supervisor starts), and its first point is the first step event in its output file;
Trainyard's is the first step the run's API shows, from the POST that launched it. Rounds take
turns, so that both meet the same load. Both nodes share this host's cores.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dashboard.experiments.scheduling.slurm.jobs import srun_command
from dashboard.serving import free_port
from tests.few_digits import few_digits_write
from tests.slurm_cluster import SlurmCluster, slurm_cluster_running, slurm_missing
from tests.stack import Stack, stack_running, wait_for

JOB = {"strategy": "ddp", "processes": 1, "nodes": 2, "epochs": 1, "batch_size": 64,
       "backend": "slurm"}  # fmt: skip


def training_command(*, data: Path, run: str) -> list[str]:
    """The command a Slurm run's supervisor starts on each node, for JOB."""
    return [
        sys.executable, "-m", "training", "--run-id", run, "--strategy", "ddp", "--dataset",
        "mnist", "--epochs", "1", "--batch-size", "64", "--lr", "0.001", "--optimizer", "adam",
        "--seed", "1", "--data-dir", str(data), "--nproc", "1", "--nnodes", "2",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"bare-{run}",
    ]  # fmt: skip


def bare_first_point(cluster: SlurmCluster, *, data: Path, home: Path, run: str) -> float:
    command = training_command(data=data, run=run)
    out = home / f"bare-{run}.out"
    script = home / f"bare-{run}.sh"
    srun = srun_command(nodes=2, cwd=Path.cwd(), command=command, tail=[])
    script.write_text(f"#!/bin/bash\nexec {shlex.join(srun)}\n")
    started = time.monotonic()
    cluster.run("sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--output={out}",
                "--export=ALL,PYTHONUNBUFFERED=1", str(script))  # fmt: skip
    wait_for(lambda: out.exists() and '"type": "step"' in out.read_text(), timeout=300,
             what="the bare job's first step", interval=0.1)  # fmt: skip
    first = time.monotonic() - started
    wait_for(lambda: not [j for j in cluster.jobs().values() if j[1] in ("RUNNING", "PENDING",
             "COMPLETING")], timeout=300, what="the bare job's end", interval=0.5)  # fmt: skip
    return first


def trainyard_first_point(stack: Stack, session: Any) -> float:
    started = time.monotonic()
    response = session.post(f"{stack.base_url}/api/experiments/", json=JOB, timeout=30)
    assert response.status_code == 201, response.text
    url = f"{stack.base_url}/api/experiments/{response.json()['id']}/"
    wait_for(lambda: session.get(url, timeout=10).json()["step"] > 0, timeout=300,
             what="the run's first step", interval=0.1)  # fmt: skip
    first = time.monotonic() - started
    wait_for(lambda: session.get(url, timeout=10).json()["status"] not in ("queued", "running"),
             timeout=300, what="the run's end", interval=0.5)  # fmt: skip
    return first


def main() -> int:
    missing = slurm_missing()
    if missing:
        print(f"needs Slurm: {', '.join(missing)} missing (.ci/system-packages)")
        return 1
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        data = home / "data"
        few_digits_write(data)
        with slurm_cluster_running(home=home / "cluster") as cluster:
            env = {**cluster.env, "TRAINYARD_SLURM": "1", "TRAINYARD_SLURM_RECONCILE_SECONDS": "2",
                   "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER": "0",
                   "TRAINYARD_LAUNCH_RATE_PER_MINUTE": "0"}  # fmt: skip
            with stack_running(home=home / "stack", data_dir=data, env_extra=env) as stack:
                stack.user_create("bench")
                session = stack.login("bench")
                bare, ours = [], []
                for index in range(rounds):
                    bare.append(bare_first_point(cluster, data=data, home=home, run=str(index)))
                    ours.append(trainyard_first_point(stack, session))
                    print(f"round {index + 1}: bare sbatch {bare[-1]:.1f} s, "
                          f"Trainyard {ours[-1]:.1f} s", flush=True)  # fmt: skip
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"launch to first point, median of {rounds}: bare sbatch {b:.1f} s, Trainyard {o:.1f} s "
          f"({o / b:.2f}x, {o - b:+.1f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
