"""Machine samples from every node of a Slurm run (issue 37, item 4): the node shell starts the
sampler beside the training on every node but the first (whose machine the supervisor samples),
its lines come back with the training's output and are taken out of it, and it ends with the
training. Here with the node shell run in this process's machine; the real cluster's two
nodes: tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from django.conf import settings

from dashboard.experiments.runs.slurm.node_sampler import (
    SAMPLE_PREFIX,
    node_sampler_command,
    node_samples_parse,
)
from dashboard.experiments.runs.slurm.step import SlurmStepProcess
from dashboard.experiments.scheduling.slurm.jobs import srun_command
from dashboard.experiments.scheduling.slurm.parse import SlurmNode

TRAINING = [sys.executable, "-c", "import time; print('trained', flush=True); time.sleep(1.5)"]


def _node(*, node_id: str, sampler: list[str]) -> subprocess.CompletedProcess[str]:
    """The task srun's step runs on a node (from `bash` on), with Slurm's variables there."""
    srun = srun_command(nodes=2, cwd=settings.BASE_DIR, command=TRAINING, tail=[],
                        sampler=sampler)  # fmt: skip
    env = {**os.environ, "SLURM_NODEID": node_id, "SLURMD_NODENAME": f"n{int(node_id) + 1}"}
    # run() waits for the streams to close: a sampler that outlived the training would hang it.
    return subprocess.run(srun[srun.index("bash") :], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip


def test_every_node_but_the_first_samples_its_machine_until_the_training_ends() -> None:
    sampler = node_sampler_command(python=sys.executable, interval=0.2)
    second = _node(node_id="1", sampler=sampler)
    assert second.stdout == "trained\n"  # the training's output is its own
    lines = [line for line in second.stderr.splitlines() if line.startswith(SAMPLE_PREFIX)]
    assert len(lines) >= 2, second.stderr
    samples = [node_samples_parse(line) for line in lines]
    assert all(s and 0 <= s["machine/n2/cpu_percent"] <= 100 for s in samples), samples
    # The first node's machine is the supervisor's to sample: no sampler there.
    first = _node(node_id="0", sampler=sampler)
    assert SAMPLE_PREFIX not in first.stderr and first.stdout == "trained\n"


def test_a_nodes_line_adds_only_its_machines_figures() -> None:
    line = SAMPLE_PREFIX + json.dumps({
        "machine/n2/cpu_percent": 40.0, "gpu/n2/0/utilization": 90, "train_loss": 0.01,
        "machine/n2/flag": True, "gpu/n2/0/memory_bytes": "many",
    })  # fmt: skip
    assert node_samples_parse(line) == {"machine/n2/cpu_percent": 40.0,
                                        "gpu/n2/0/utilization": 90.0}  # fmt: skip
    # Keys of the job's nodes only, as the sampler names them: a script's own are no series.
    made_up = {f"machine/n2/cpu_{i}": 1 for i in range(3)} | {"gpu/n9/0/utilization": 5}
    assert node_samples_parse(SAMPLE_PREFIX + json.dumps(made_up), nodes=["n1", "n2"]) == {}
    assert node_samples_parse(line, nodes=["n1"]) == {}
    assert node_samples_parse(SAMPLE_PREFIX + "[1, 2") == {}
    assert node_samples_parse("an ordinary line") is None


def test_the_step_keeps_a_nodes_samples_out_of_the_trainings_output() -> None:
    said = f"import sys; print('{SAMPLE_PREFIX}{{\"machine/n2/cpu_percent\": 5}}', file=sys.stderr)"
    popen: Any = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", f"{said}; print('a log line', file=sys.stderr)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    nodes = [SlurmNode(name, "", 1, 0, "", name) for name in ("n1", "n2")]
    process = SlurmStepProcess(popen, job_id="7", nodes=nodes)
    lines, closed = [], 0
    for _ in range(100):  # both streams closed well before
        source, text = process.line_next(1.0)
        if text is None:
            closed += 1
            if closed == 2:
                break
        elif text:
            lines.append((source, text))
    popen.wait()
    assert ("stderr", "a log line\n") in lines
    assert not [text for _, text in lines if text and SAMPLE_PREFIX in text]
    assert process.samples_take() == [{"machine/n2/cpu_percent": 5.0}]
    assert process.samples_take() == []
