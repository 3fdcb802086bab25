"""What the online workers can run, and whether a requested run fits on one of them (or, for a
run over several machines, on as many of them as it asks for)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from dashboard.devices.models import WorkerMachine
from training.refusals import RULE_MIN_GPUS, gpu_ids_text, plural, strategy_refusals
from training.registry import STRATEGIES, STRATEGY_NAMES, StrategySpec

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


def _processes(count: int) -> str:
    return plural(count, "process", "processes")


def machine_gpus_text(machine: MachineCapacity) -> str:
    return f"{machine.hostname} has {gpu_ids_text(machine.gpu_ids)}"


def _largest_text(capacity: Capacity, machine: MachineCapacity) -> str:
    if capacity.from_workers:
        return f"the largest worker ({machine.hostname})"
    return f"no worker is online and this web server ({machine.hostname})"


def capacity_check_cpu(*, capacity: Capacity, strategy: str, processes: int) -> list[str]:
    if not STRATEGIES[strategy].processes:
        return []  # the one-process strategies on CPU; any machine will do
    largest = max(capacity.machines, key=lambda m: (m.cpu_count, m.hostname))
    if processes <= largest.cpu_count:
        return []
    return [
        f"{STRATEGIES[strategy].short} asks for {_processes(processes)} but "
        f"{_largest_text(capacity, largest)} has {plural(largest.cpu_count, 'CPU core')} and "
        f"{gpu_ids_text(largest.gpu_ids)}"
    ]


def capacity_check_min_gpus(*, capacity: Capacity, spec: StrategySpec, refused: str) -> list[str]:
    """A strategy that needs several GPUs on one machine (``refused`` says so): say which has."""
    enough = [m for m in capacity.machines if len(m.gpu_ids) >= spec.min_gpus]
    if enough:
        return [f"{refused}: {'; '.join(machine_gpus_text(m) for m in enough)}"]
    most = max(capacity.machines, key=lambda m: (len(m.gpu_ids), m.hostname))
    return [
        f"{refused}, but {_largest_text(capacity, most)} has {gpu_ids_text(most.gpu_ids)}; "
        "pick another strategy"
    ]


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


def machine_fits(
    machine: MachineCapacity, *, strategy: str, processes: int, gpus: list[int]
) -> bool:
    """Whether the machine could ever take one node's share: its GPUs, or a core per rank."""
    if gpus:
        return set(gpus) <= set(machine.gpu_ids)
    return not STRATEGIES[strategy].processes or processes <= machine.cpu_count


def machine_text(machine: MachineCapacity) -> str:
    return (
        f"{machine.hostname} has {plural(machine.cpu_count, 'CPU core')} and "
        f"{gpu_ids_text(machine.gpu_ids)}"
    )


def capacity_check_machines(
    *, capacity: Capacity, strategy: str, processes: int, gpus: list[int], nodes: int,
    machines: list[str],
) -> list[str]:  # fmt: skip
    """A run over `nodes` machines (or pinned to `machines`): enough online workers, each able
    to take its share. Says what there is when not."""
    known = set(WorkerMachine.objects.values_list("hostname", flat=True))
    unknown = [name for name in machines if name not in known]
    if unknown:
        workers = ", ".join(sorted(known)) or "none has reported yet"
        return [f"no worker named {', '.join(unknown)}: the workers are {workers}"]
    online = capacity.machines if capacity.from_workers else []
    offline = [name for name in machines if name not in {m.hostname for m in online}]
    if offline:
        return [f"{', '.join(offline)} {'is' if len(offline) == 1 else 'are'} not online"]
    pool = [m for m in online if not machines or m.hostname in machines]
    share = gpu_ids_text(gpus) if gpus else _processes(processes)
    asked = f"{STRATEGIES[strategy].short} asks for {plural(nodes, 'machine')} with {share} each"
    available = "; ".join(machine_text(m) for m in pool) or "no worker is online"
    if len(pool) < nodes:
        return [f"{asked}, but {plural(len(pool), 'worker')} online: {available}"]
    fits = [m for m in pool if machine_fits(m, strategy=strategy, processes=processes, gpus=gpus)]
    # Pinned: every named machine must fit; else any `nodes` of the online ones.
    if len(fits) < (len(pool) if machines else nodes):
        return [
            f"{asked}, but only {plural(len(fits), 'of them fits', 'of them fit')}: {available}"
        ]
    return []


def capacity_check(
    *,
    strategy: str,
    processes: int,
    gpus: list[int],
    nodes: int = 1,
    machines: list[str] | None = None,
) -> list[str]:
    """Human messages saying why a run cannot fit; empty when it can. gpus empty means CPU."""
    strategy = str(strategy)
    if strategy not in STRATEGIES:
        return [f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGY_NAMES)}"]
    spec = STRATEGIES[strategy]
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

    # The strategy's own rules (training/registry.py: the CLI keeps the same); its GPU minimum
    # is said with the machines that have enough.
    refusals = strategy_refusals(strategy, processes=processes, gpus=gpus)
    errors += [r.message for r in refusals if r.rule != RULE_MIN_GPUS]
    if spec.cpu_only and gpus:
        return errors  # nothing on any machine would make it fit

    capacity = capacity_summary()
    if nodes > 1 or machines:
        return errors + capacity_check_machines(
            capacity=capacity, strategy=strategy, processes=processes, gpus=gpus, nodes=nodes,
            machines=list(machines or []),
        )  # fmt: skip
    too_few = [r.message for r in refusals if r.rule == RULE_MIN_GPUS]
    if too_few:
        errors += capacity_check_min_gpus(capacity=capacity, spec=spec, refused=too_few[0])
    elif gpus:
        errors += capacity_check_gpu_ids(capacity=capacity, gpus=gpus)
    else:
        errors += capacity_check_cpu(capacity=capacity, strategy=strategy, processes=processes)
    return errors
