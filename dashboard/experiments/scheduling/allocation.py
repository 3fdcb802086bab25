"""Which worker machines can take a run now: GPUs never shared, CPU threads never above cores.

The check and the claim happen in one transaction that holds the machines' locks (row locks on
PostgreSQL, taken in host name order so that two claims never wait on each other in a cycle;
SQLite's IMMEDIATE transactions serialise writers anyway), so two runs started in the same
second can never both get the same GPU or the same cores. A run over N machines is placed all
or nothing: it starts only when N machines can each take their share at once, so two such runs
can never each hold half of what they need.

A machine is busy with every running run whose placement names it (a node of a multi-node run
counts where it runs, not only on the node that claimed it).
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import NotRequired, TypedDict

from dashboard.devices.catalogue import (
    MachineCatalogue,
    catalogue_from_report,
    catalogue_missing,
    catalogue_of,
)
from dashboard.devices.facts import machine_facts_collect, worker_address
from dashboard.devices.models import WorkerMachine
from dashboard.env import env_str
from dashboard.experiments.models import PROCESS_STRATEGIES, Backend, Experiment, Status
from training.refusals import gpu_ids_text, plural

RDZV_PORTS_DEFAULT = "29400-29499"


@dataclass(frozen=True)
class Machine:
    name: str
    cpu_count: int
    gpu_ids: frozenset[int]
    address: str = ""  # where the other machines reach it (WorkerMachine.address)
    # What it can train, from its report; None: not known here (a machine with no row yet),
    # taken as the built-ins, as an old report is.
    catalogue: MachineCatalogue | None = None


class PlacementEntry(TypedDict):
    """One machine of a run's placement (Experiment.placement), ordered by node_rank."""

    worker: str
    address: str
    node_rank: int
    ranks: list[int]  # the global ranks that ran there: filled in by the job once known
    rdzv_endpoint: NotRequired[str]  # "ADDR0:PORT", multi-node runs only


@functools.cache
def machine_local(*, worker: str) -> Machine:
    facts = machine_facts_collect(with_torch=False)
    gpu_ids = frozenset(int(gpu["index"]) for gpu in facts.get("gpus") or [])
    return Machine(worker, int(facts.get("cpu_count") or os.cpu_count() or 1), gpu_ids)


def machine_from_row(row: WorkerMachine) -> Machine:
    """Another machine, as its worker last reported it."""
    report = row.report or {}
    gpus = [gpu for gpu in report.get("gpus") or [] if isinstance(gpu.get("index"), int)]
    cpu_count = int(report.get("cpu_count") or 1)
    gpu_ids = frozenset(gpu["index"] for gpu in gpus)
    return Machine(row.hostname, cpu_count, gpu_ids, row.address, catalogue_of(row))


def machines_online() -> list[Machine]:
    """Every machine whose worker reported lately, as it reported itself."""
    return [machine_from_row(row) for row in WorkerMachine.objects.online()]


def run_cpu_threads(*, strategy: str, processes: int, gpus: list[int], cpu_count: int) -> int:
    """CPU threads a run occupies on each of its machines; GPU runs are bound by their GPUs."""
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


def _runs(runs: Iterable[Experiment]) -> str:
    return ", ".join(f"#{run.pk}" for run in runs)


@dataclass(frozen=True)
class PlacementRefusal:
    text: str  # the whole sentence, a one-machine run's waiting reason
    short: str  # what a multi-machine run's reason says of this machine: "host-b busy with #7"


def machine_catalogued(machine: Machine, *, row: WorkerMachine | None = None) -> Machine:
    """The machine with what it can train, from its row (this worker's own report, for the
    machine a claim runs on, which machine_local reads without the catalogue)."""
    if machine.catalogue is not None:
        return machine
    row = row or WorkerMachine.objects.filter(hostname=machine.name).first()
    return replace(machine, catalogue=catalogue_of(row)) if row is not None else machine


def catalogue_refusal(*, experiment: Experiment, machine: Machine) -> PlacementRefusal | None:
    """The run's model, dataset or image folder missing on the machine: it never fits there,
    however long it waits, so say what is missing where."""
    catalogue = machine.catalogue or catalogue_from_report(hostname=machine.name, report=None)
    missing = catalogue_missing(
        catalogue,
        model=experiment.model,
        dataset=experiment.dataset,
        data_path=experiment.data_path,
    )
    if not missing:
        return None
    lacks = f"{machine.name} lacks {', '.join(missing)}"
    return PlacementRefusal(f"waiting for a machine with what the run needs: {lacks}", lacks)


def machine_refusal(
    *, experiment: Experiment, machine: Machine, busy: list[Experiment]
) -> PlacementRefusal | None:
    """Why this machine cannot take its share of the run now, or None when it can."""
    lacking = catalogue_refusal(experiment=experiment, machine=machine)
    if lacking is not None:
        return lacking
    wanted = set(experiment.gpus)
    if wanted and not wanted <= machine.gpu_ids:
        have = _ids(machine.gpu_ids) or "none"
        text = f"waiting for GPUs {_ids(wanted)}: {machine.name} has GPUs {have}"
        return PlacementRefusal(text, f"{machine.name} has GPUs {have}")
    holders = [run for run in busy if wanted & set(run.gpus)]
    if holders:
        taken = wanted & {g for run in holders for g in run.gpus}
        count = len(wanted)
        text = (
            f"waiting for {count} GPU{'s' if count > 1 else ''} on {machine.name}: "
            f"GPU {_ids(taken)} in use by {_runs(holders)}"
        )
        return PlacementRefusal(text, f"{machine.name} busy with {_runs(holders)}")
    need = _threads(experiment, machine)
    cpu_busy = [run for run in busy if _threads(run, machine)]
    used = sum(_threads(run, machine) for run in cpu_busy)
    if need and cpu_busy and used + need > machine.cpu_count:
        text = (
            f"waiting for {plural(need, 'CPU core')} on {machine.name}: "
            f"{used} of {machine.cpu_count} in use by {_runs(cpu_busy)}"
        )
        return PlacementRefusal(text, f"{machine.name} busy with {_runs(cpu_busy)}")
    return None


def allocation_refusal(
    *, experiment: Experiment, machine: Machine, busy: list[Experiment]
) -> str | None:
    """Why this machine cannot start the run now, or None when it can."""
    refusal = machine_refusal(experiment=experiment, machine=machine, busy=busy)
    return refusal.text if refusal else None


def placement_workers(run: Experiment) -> list[str]:
    """The machines a run holds: its placement's, or its worker's for a run claimed before
    placements were written."""
    named = [
        str(e["worker"]) for e in run.placement or [] if isinstance(e, dict) and e.get("worker")
    ]
    return named or ([run.worker] if run.worker else [])


def busy_by_machine(running: Iterable[Experiment]) -> dict[str, list[Experiment]]:
    busy: dict[str, list[Experiment]] = {}
    for run in running:
        for name in dict.fromkeys(placement_workers(run)):
            busy.setdefault(name, []).append(run)
    return busy


def rdzv_ports() -> list[int]:
    """TRAINYARD_RDZV_PORTS: "29400-29499", or a list such as "29400,29410-29419"."""
    ports: list[int] = []
    raw = env_str("TRAINYARD_RDZV_PORTS", RDZV_PORTS_DEFAULT)
    for item in (part.strip() for part in raw.split(",")):
        low, _, high = item.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(
                f"TRAINYARD_RDZV_PORTS={raw!r}: use ports such as 29400-29499"
            ) from None
        ports += range(first, last + 1)
    return ports


def _endpoint_port(endpoint: object) -> int | None:
    _, _, port = str(endpoint or "").rpartition(":")
    return int(port) if port.isdigit() else None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def rdzv_port_pick(*, worker: str, running: Iterable[Experiment]) -> int | None:
    """A rendezvous port for a run hosted on `worker` (this machine): one of
    TRAINYARD_RDZV_PORTS that no other running run hosted here uses and nothing has bound."""
    used = {
        _endpoint_port(run.placement[0].get("rdzv_endpoint"))
        for run in running
        if run.placement and isinstance(run.placement[0], dict)
        and run.placement[0].get("worker") == worker
    }  # fmt: skip
    return next((p for p in rdzv_ports() if p not in used and port_free(p)), None)


@dataclass(frozen=True)
class PlacementPlan:
    """What the claim found: where the run starts (its placement), why it waits (reason), or
    which machine's worker should claim it instead (route_to: a pinned run's first machine, or
    a machine that fits when this one does not)."""

    placement: list[PlacementEntry] = field(default_factory=list)
    reason: str = ""
    route_to: str = ""


def _entry(machine: Machine, node_rank: int) -> PlacementEntry:
    return {
        "worker": machine.name,
        "address": machine.address or machine.name,
        "node_rank": node_rank,
        "ranks": [],
    }


def placement_candidates(*, experiment: Experiment, local: Machine) -> list[str]:
    """The machines a claim on `local` looks at, in the order they would be chosen; a pinned
    run's list may leave `local` out (the claim then sends it to its first machine)."""
    if experiment.machines:
        return [str(name) for name in experiment.machines]
    if experiment.nodes <= 1:
        return [local.name]
    online = WorkerMachine.objects.online().order_by("hostname")
    return list(dict.fromkeys([local.name, *online.values_list("hostname", flat=True)]))


def machines_lock(names: list[str]) -> dict[str, WorkerMachine]:
    """Lock the machines' rows for the claim's transaction, always in host name order: two
    claims that lock overlapping sets then queue behind one another instead of deadlocking."""
    rows = WorkerMachine.objects.select_for_update().filter(hostname__in=names)
    return {row.hostname: row for row in rows.order_by("hostname")}


def share_text(*, experiment: Experiment, machine: Machine) -> str:
    """What each machine must have free: "1 free core", "GPUs 0, 1 free"."""
    if experiment.gpus:
        return f"{gpu_ids_text(sorted(experiment.gpus))} free"
    return plural(_threads(experiment, machine), "free core")


# Which earlier queued run's turn on a machine comes first (queue.queue_turn_check), or None.
TurnCheck = Callable[[Machine], Experiment | None]


def placement_plan(
    *,
    experiment: Experiment,
    local: Machine,
    names: list[str],
    rows: dict[str, WorkerMachine],
    turn: TurnCheck | None = None,
    elsewhere: bool = False,
) -> PlacementPlan:
    """Where a queued run can start now with this worker's machine (`local`, one of `names`) as
    node 0. Call inside the claim's transaction, with the rows of `names` locked
    (machines_lock): it reads what runs on them. `turn`: the queue's rule for the further
    machines of a multi-node run (queue.queue_turn_check says why; the claim asks it of `local`
    itself), and for `elsewhere`: a one-machine run `local` has no room for is sent to an
    online machine that has room and where it is its turn (that worker's claim decides)."""
    local = replace(machine_catalogued(local, row=rows.get(local.name)), address=worker_address())
    # A Slurm run's nodes are its cluster's, whatever their names: no worker's devices.
    running = list(
        Experiment.objects.filter(status=Status.RUNNING, backend=Backend.CELERY).exclude(
            pk=experiment.pk
        )
    )
    busy = busy_by_machine(running)
    others = [rows[n] for n in names if n in rows and n != local.name and rows[n].is_online]
    machines = [local, *(machine_from_row(row) for row in others)]
    refusals = {
        m.name: machine_refusal(experiment=experiment, machine=m, busy=busy.get(m.name, []))
        for m in machines
    }
    if experiment.nodes <= 1:
        refusal = refusals[local.name]
        if refusal is None:
            return PlacementPlan(placement=[_entry(local, 0)])
        having = None if experiment.machines else machine_with_catalogue(experiment, local)
        if having is None and elsewhere and not experiment.machines:
            having = machine_with_room(experiment=experiment, local=local, busy=busy, turn=turn)
        return PlacementPlan(route_to=having) if having else PlacementPlan(reason=refusal.text)
    for m in machines[1:]:
        blocker = turn(m) if turn is not None and refusals[m.name] is None else None
        if blocker is not None:
            text = f"waiting behind #{blocker.pk}, whose turn on {m.name} comes first"
            refusals[m.name] = PlacementRefusal(text, f"{m.name} keeps its turn for #{blocker.pk}")
    fitting = [m for m in machines if refusals[m.name] is None]
    if refusals[local.name] is None and len(fitting) >= experiment.nodes:
        # This machine first: node 0, the rendezvous host.
        return _rendezvous_plan(chosen=fitting[: experiment.nodes], running=running)
    if not experiment.machines and len(fitting) >= experiment.nodes:
        return PlacementPlan(route_to=fitting[0].name)
    offline = [n for n in names if n != local.name and n not in {m.name for m in machines}]
    reason = placement_waiting_reason(
        experiment=experiment, local=local, refusals=refusals, offline=offline
    )
    return PlacementPlan(reason=reason)


def machine_with_catalogue(experiment: Experiment, local: Machine) -> str | None:
    """An online machine that has the run's model, dataset and folder, where `local` lacks
    them (a one-machine run, not pinned): the run is sent to its worker, which never sends
    it back (it has them)."""
    if catalogue_refusal(experiment=experiment, machine=local) is None:
        return None
    for row in WorkerMachine.objects.online().exclude(hostname=local.name).order_by("hostname"):
        if catalogue_refusal(experiment=experiment, machine=machine_from_row(row)) is None:
            return row.hostname
    return None


def machine_with_room(
    *,
    experiment: Experiment,
    local: Machine,
    busy: dict[str, list[Experiment]],
    turn: TurnCheck | None,
) -> str | None:
    """Another online machine that could start the one-machine run now (its devices free, its
    turn there), in host name order, or None."""
    for row in WorkerMachine.objects.online().exclude(hostname=local.name).order_by("hostname"):
        machine = machine_from_row(row)
        if machine_refusal(experiment=experiment, machine=machine, busy=busy.get(row.hostname, [])):
            continue
        if turn is None or turn(machine) is None:
            return row.hostname
    return None


def _rendezvous_plan(*, chosen: list[Machine], running: list[Experiment]) -> PlacementPlan:
    host = chosen[0]
    port = rdzv_port_pick(worker=host.name, running=running)
    if port is None:
        ports = env_str("TRAINYARD_RDZV_PORTS", RDZV_PORTS_DEFAULT)
        return PlacementPlan(
            reason=f"waiting for a free rendezvous port on {host.name}: {ports} all taken"
        )
    placement = [_entry(machine, k) for k, machine in enumerate(chosen)]
    for entry in placement:
        entry["rdzv_endpoint"] = f"{placement[0]['address']}:{port}"
    return PlacementPlan(placement=placement)


def placement_waiting_reason(
    *,
    experiment: Experiment,
    local: Machine,
    refusals: dict[str, PlacementRefusal | None],
    offline: list[str],
) -> str:
    """ "waiting for 2 machines with 1 free core each: host-b busy with #7"."""
    why = [refusal.short for _, refusal in sorted(refusals.items()) if refusal is not None]
    if experiment.machines:
        why += [f"{name} is not online" for name in offline]
    elif len(refusals) < experiment.nodes:
        why.append(f"{plural(len(refusals), 'machine')} online ({', '.join(refusals)})")
    share = share_text(experiment=experiment, machine=local)
    return f"waiting for {experiment.nodes} machines with {share} each: {'; '.join(why)}"
