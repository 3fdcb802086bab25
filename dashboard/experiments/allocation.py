"""Which runs a worker machine can take now: GPUs never shared, CPU threads never above cores.

The check and the claim happen in one transaction that holds this machine's lock (a row lock on
PostgreSQL; SQLite's IMMEDIATE transactions serialise writers anyway), so two runs started in the
same second can never both get the same GPU or the same cores.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass

from dashboard.experiments.models import PROCESS_STRATEGIES, Experiment


@dataclass(frozen=True)
class Machine:
    name: str
    cpu_count: int
    gpu_ids: frozenset[int]


@functools.cache
def machine_local(*, worker: str) -> Machine:
    from dashboard.devices.facts import machine_facts_collect

    facts = machine_facts_collect(with_torch=False)
    gpu_ids = frozenset(int(gpu["index"]) for gpu in facts.get("gpus") or [])
    return Machine(worker, int(facts.get("cpu_count") or os.cpu_count() or 1), gpu_ids)


def run_cpu_threads(*, strategy: str, processes: int, gpus: list[int], cpu_count: int) -> int:
    """CPU threads a run occupies on its machine; GPU runs are bound by their GPUs instead."""
    if gpus:
        return 0
    if strategy in PROCESS_STRATEGIES:
        # One process per rank, each held to one thread (torchrun's own default).
        return processes
    limit = int(os.environ.get("TRAINYARD_CPU_THREADS_PER_RUN") or cpu_count)
    return max(1, min(limit, cpu_count))


def _threads(run: Experiment, machine: Machine) -> int:
    return run_cpu_threads(
        strategy=run.strategy, processes=run.processes, gpus=run.gpus, cpu_count=machine.cpu_count
    )


def _ids(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in sorted(values))


def allocation_refusal(
    *, experiment: Experiment, machine: Machine, busy: list[Experiment]
) -> str | None:
    """Why this machine cannot start the run now, or None when it can."""
    wanted = set(experiment.gpus)
    if wanted and not wanted <= machine.gpu_ids:
        have = _ids(machine.gpu_ids) or "none"
        return f"waiting for GPUs {_ids(wanted)}: {machine.name} has GPUs {have}"
    for run in busy:
        taken = wanted & set(run.gpus)
        if taken:
            count = len(wanted)
            return (
                f"waiting for {count} GPU{'s' if count > 1 else ''} on {machine.name}: "
                f"GPU {_ids(taken)} in use by #{run.pk}"
            )
    need = _threads(experiment, machine)
    cpu_busy = [run for run in busy if _threads(run, machine)]
    used = sum(_threads(run, machine) for run in cpu_busy)
    if need and cpu_busy and used + need > machine.cpu_count:
        holders = ", ".join(f"#{run.pk}" for run in cpu_busy)
        return (
            f"waiting for {need} CPU core{'s' if need > 1 else ''} on {machine.name}: "
            f"{used} of {machine.cpu_count} in use by {holders}"
        )
    return None
