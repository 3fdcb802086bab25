"""A node's machine samples in a Slurm run, for the nodes its supervisor is not on.

The supervisor samples its own machine, the job's first node, as a worker does (runner.py). On
every other node the node shell (scheduling/slurm/jobs.py's NODE_SHELL) starts this beside the
training, in the background: each interval it writes one line of that node's samples (the keys
of devices/facts.py, under the node's name) to the task's stderr, which srun brings to the
supervisor with the training's output; the step takes those lines out of it (step.py) and adds
them to the run's series. It ends with the training: its parent is the node shell that became
the training.

    python -m dashboard.experiments.runs.slurm.node_sampler --parent PID --interval SECONDS
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Collection, Sequence

# A line of this prefix on a node's stderr is a sample, not the training's output.
SAMPLE_PREFIX = "trainyard-node-sample "
# The series a node's line may add: its machine's and its GPUs' as devices/facts.py names them
# (never a training's figure, nor a key of a script's making: any rank may print the prefix,
# and each new key would be a series of the run's).
SAMPLE_KEY = re.compile(r"^(?:machine/([^/]{1,100})/cpu_percent|"
                        r"gpu/([^/]{1,100})/\d{1,3}/(?:utilization|memory_bytes))$")  # fmt: skip


def node_sampler_command(*, python: str, interval: float) -> list[str]:
    """The sampler's argv, less `--parent` (the node shell adds its own PID)."""
    module = "dashboard.experiments.runs.slurm.node_sampler"
    return [python, "-m", module, "--interval", f"{interval:g}"]


def node_samples_parse(line: str, *, nodes: Collection[str] = ()) -> dict[str, float] | None:
    """The samples of a node's line (None: not one). Only machine and GPU keys of the job's
    `nodes` (any node where none are given), only numbers: a training that prints the prefix
    itself adds no figure of its own."""
    if not line.startswith(SAMPLE_PREFIX):
        return None
    try:
        found = json.loads(line[len(SAMPLE_PREFIX) :])
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {
        key: float(value)
        for key, value in found.items()
        if (named := SAMPLE_KEY.match(str(key)))
        and (not nodes or (named[1] or named[2]) in nodes)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a Slurm node's machine samples, to stderr")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--interval", type=float, required=True)
    args = parser.parse_args(argv)
    # Imported here: --help and a bad argument do not wait for psutil and NVML.
    from dashboard.devices.facts import machine_samples_collect

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    machine_samples_collect(worker=node)  # primes psutil's CPU percent
    while True:
        time.sleep(max(0.2, args.interval))
        if os.getppid() != args.parent:  # the training ended (this process was handed on)
            return 0
        samples = machine_samples_collect(worker=node)
        try:
            sys.stderr.write(SAMPLE_PREFIX + json.dumps(samples) + "\n")
            sys.stderr.flush()
        except OSError:  # the step's output is gone: the job is ending
            return 0


if __name__ == "__main__":
    sys.exit(main())
