"""What the online workers can run, and whether a requested run fits on one of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import PROCESS_STRATEGIES

STRATEGIES = ("single", "dp", "ddp", "dp-primitives", "model-parallel", "hogwild", "deepspeed")
STRATEGY_LABELS = {
    "single": "single",
    "dp": "DataParallel",
    "ddp": "DDP",
    "dp-primitives": "DataParallel primitives",
    "model-parallel": "model parallel",
    "hogwild": "Hogwild",
    "deepspeed": "DeepSpeed",
}
# With GPUs these run one process per GPU.
PROCESS_PER_GPU_STRATEGIES = ("ddp", "deepspeed")
# The model is cut in two: the convolutions and the classifier.
MODEL_PARALLEL_STAGES = 2
DP_PRIMITIVES_MIN_GPUS = 2
SOURCE_WORKERS = "workers"
SOURCE_WEB = "web"


@dataclass(frozen=True)
class MachineCapacity:
    hostname: str
    cpu_count: int
    gpu_ids: list[int]
    gpu_names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Capacity:
    machines: list[MachineCapacity]
    # "workers" when at least one worker is online; "web" when the figures are this web
    # server's own, because no worker has reported lately (a run will wait for one).
    source: str
    source_note: str
    max_cpu_count: int
    max_gpu_count: int
    gpu_ids_by_machine: dict[str, list[int]]

    @property
    def from_workers(self) -> bool:
        return self.source == SOURCE_WORKERS


def machine_capacity_from_report(*, hostname: str, report: dict[str, Any]) -> MachineCapacity:
    gpus = [gpu for gpu in report.get("gpus") or [] if isinstance(gpu.get("index"), int)]
    return MachineCapacity(
        hostname=hostname,
        cpu_count=int(report.get("cpu_count") or 0),
        gpu_ids=sorted(gpu["index"] for gpu in gpus),
        gpu_names=[gpu.get("name") or "" for gpu in sorted(gpus, key=lambda g: g["index"])],
    )


def capacity_summary() -> Capacity:
    machines = [
        machine_capacity_from_report(hostname=machine.hostname, report=machine.report)
        for machine in WorkerMachine.objects.online()
    ]
    if machines:
        source, note = SOURCE_WORKERS, f"{len(machines)} worker machine(s) online"
    else:
        # Imported here: only the fallback needs it, and it needs no torch (with_torch=False).
        from dashboard.devices.facts import machine_facts_collect

        own = machine_facts_collect(with_torch=False)
        machines = [machine_capacity_from_report(hostname=own["hostname"], report=own)]
        source = SOURCE_WEB
        note = (
            f"no worker has reported in the last {settings.TRAINYARD_WORKER_STALE_SECONDS} s; "
            f"showing this web server's own CPUs and GPUs"
        )
    return Capacity(
        machines=machines,
        source=source,
        source_note=note,
        max_cpu_count=max(m.cpu_count for m in machines),
        max_gpu_count=max(len(m.gpu_ids) for m in machines),
        gpu_ids_by_machine={m.hostname: m.gpu_ids for m in machines},
    )


def _plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else (words or word + 's')}"


def _processes(count: int) -> str:
    return _plural(count, "process", "processes")


def gpu_ids_text(ids: Iterable[int]) -> str:
    ids = list(ids)
    if not ids:
        return "no GPU"
    return f"GPU{'s' if len(ids) > 1 else ''} {', '.join(str(i) for i in ids)}"


def machine_gpus_text(machine: MachineCapacity) -> str:
    return f"{machine.hostname} has {gpu_ids_text(machine.gpu_ids)}"


def _largest_text(capacity: Capacity, machine: MachineCapacity) -> str:
    if capacity.from_workers:
        return f"the largest worker ({machine.hostname})"
    return f"no worker is online and this web server ({machine.hostname})"


def capacity_check_cpu(*, capacity: Capacity, strategy: str, processes: int) -> list[str]:
    if strategy not in PROCESS_STRATEGIES:
        return []  # the one-process strategies on CPU; any machine will do
    largest = max(capacity.machines, key=lambda m: (m.cpu_count, m.hostname))
    if processes <= largest.cpu_count:
        return []
    return [
        f"{STRATEGY_LABELS[strategy]} asks for {_processes(processes)} but "
        f"{_largest_text(capacity, largest)} has {_plural(largest.cpu_count, 'CPU core')} and "
        f"{gpu_ids_text(largest.gpu_ids)}"
    ]


def capacity_check_dp_primitives(*, capacity: Capacity, gpus: list[int]) -> list[str]:
    """replicate/scatter/gather need two GPUs or more on one machine; say which machine has."""
    if len(gpus) >= DP_PRIMITIVES_MIN_GPUS:
        return []
    most = max(capacity.machines, key=lambda m: (len(m.gpu_ids), m.hostname))
    asked = f"got {gpu_ids_text(gpus)}" if gpus else "no GPU ids were given"
    if len(most.gpu_ids) >= DP_PRIMITIVES_MIN_GPUS:
        where = "; ".join(
            machine_gpus_text(m)
            for m in capacity.machines
            if len(m.gpu_ids) >= DP_PRIMITIVES_MIN_GPUS
        )
        return [
            f"DataParallel primitives need at least {DP_PRIMITIVES_MIN_GPUS} GPUs on one "
            f"machine ({asked}): {where}"
        ]
    return [
        f"DataParallel primitives need at least {DP_PRIMITIVES_MIN_GPUS} GPUs on one machine "
        f"({asked}), but {_largest_text(capacity, most)} has {gpu_ids_text(most.gpu_ids)}; "
        "pick another strategy"
    ]


def capacity_check_combination(*, strategy: str, processes: int, gpus: list[int]) -> list[str]:
    """Rules of each strategy that need no machine: how many GPUs and processes go together."""
    label = STRATEGY_LABELS[strategy]
    if strategy == "single" and len(gpus) > 1:
        return [f"a single-device run uses one GPU, not {len(gpus)} ({gpu_ids_text(gpus)})"]
    if strategy in PROCESS_PER_GPU_STRATEGIES and gpus and processes != len(gpus):
        return [
            f"{label} runs one process per GPU: {_processes(processes)} "
            f"for {_plural(len(gpus), 'GPU')} ({gpu_ids_text(gpus)})"
        ]
    if strategy == "model-parallel" and len(gpus) > MODEL_PARALLEL_STAGES:
        return [
            f"model parallel splits the model into {MODEL_PARALLEL_STAGES} stages: give 0, 1 or "
            f"{MODEL_PARALLEL_STAGES} GPU ids (none: both stages on the CPU; one: a stage on "
            f"it and the other on the CPU), not {len(gpus)} ({gpu_ids_text(gpus)})"
        ]
    if strategy == "hogwild" and gpus:
        return [
            "Hogwild trains on the CPU: its processes share one model in CPU shared memory; "
            f"leave the GPU ids empty (got {gpu_ids_text(gpus)})"
        ]
    return []


def capacity_check_gpu_ids(*, capacity: Capacity, gpus: list[int]) -> list[str]:
    """Every requested id must exist on one machine: a run never spans machines."""
    wanted = set(gpus)
    if any(wanted <= set(m.gpu_ids) for m in capacity.machines):
        return []
    asked = sorted(wanted)
    if len(capacity.machines) == 1:
        machine = capacity.machines[0]
        missing = [i for i in asked if i not in machine.gpu_ids]
        verb = "does" if len(missing) == 1 else "do"
        return [f"{gpu_ids_text(missing)} {verb} not exist: {machine_gpus_text(machine)}"]
    everywhere = {i for m in capacity.machines for i in m.gpu_ids}
    missing = [i for i in asked if i not in everywhere]
    machines_text = "; ".join(machine_gpus_text(m) for m in capacity.machines)
    if missing:
        verb = "does" if len(missing) == 1 else "do"
        return [f"{gpu_ids_text(missing)} {verb} not exist on any online worker: {machines_text}"]
    return [f"{gpu_ids_text(asked)} are not all on one machine: {machines_text}"]


def capacity_check(*, strategy: str, processes: int, gpus: list[int]) -> list[str]:
    """Human messages saying why a run cannot fit; empty when it can. gpus empty means CPU."""
    strategy = str(strategy)
    if strategy not in STRATEGIES:
        return [f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}"]
    errors: list[str] = []
    if processes < 1:
        errors.append(f"processes must be at least 1, not {processes}")
    bad = [i for i in gpus if not isinstance(i, int) or isinstance(i, bool) or i < 0]
    if bad:
        errors.append(f"GPU ids are whole numbers from 0: {bad!r} are not")
    duplicates = sorted({i for i in gpus if gpus.count(i) > 1 and i not in bad})
    if duplicates:
        errors.append(f"{gpu_ids_text(duplicates)} listed more than once")
    if errors:
        return errors

    errors += capacity_check_combination(strategy=strategy, processes=processes, gpus=gpus)
    if strategy == "hogwild" and gpus:
        return errors  # nothing on any machine would make it fit

    capacity = capacity_summary()
    if strategy == "dp-primitives" and len(gpus) < DP_PRIMITIVES_MIN_GPUS:
        errors += capacity_check_dp_primitives(capacity=capacity, gpus=gpus)
    elif gpus:
        errors += capacity_check_gpu_ids(capacity=capacity, gpus=gpus)
    else:
        errors += capacity_check_cpu(capacity=capacity, strategy=strategy, processes=processes)
    return errors
