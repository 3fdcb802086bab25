"""The device page and its JSON feed: what every worker machine last reported."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from ninja import Router, Schema
from pydantic import ConfigDict

from dashboard.api import errors
from dashboard.devices.catalogue import catalogue_card, catalogue_of
from dashboard.devices.facts import SHM_LOW_BYTES
from dashboard.devices.models import WorkerMachine
from dashboard.experiments.selectors import slurm_cluster_facts
from dashboard.texts import bytes_text, gpu_status_text, ranks_text
from training.refusals import plural

POLL_SECONDS = 5

router = Router(tags=["devices"])


class MachineOut(Schema):
    model_config = ConfigDict(extra="allow")

    hostname: str
    address: str | None = None  # where the other machines reach it
    online: bool
    reported_at: str
    age_seconds: int
    report: dict[str, Any]
    runs: list[dict[str, Any]]
    models: list[str]  # names it can train ([] for a report from before the catalogue)
    datasets: list[str]
    catalogue: dict[str, Any]  # the same as the device page shows it
    now: dict[str, Any]  # cores and GPUs held and by which runs, how busy, in words


class MachinesOut(Schema):
    machines: list[MachineOut]


def machine_age_seconds(machine: WorkerMachine) -> int:
    return max(0, int((timezone.now() - machine.reported_at).total_seconds()))


def machine_api_item(
    machine: WorkerMachine, *, runs: list[dict[str, Any]], holds: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    catalogue = catalogue_of(machine)
    return {
        "hostname": machine.hostname,
        # Where the other machines reach it (a multi-node run's rendezvous and ranks).
        "address": machine.address,
        "online": machine.is_online,
        "reported_at": machine.reported_at.isoformat(),
        # Server-side age, so that a browser with a wrong clock still says "N s ago" right.
        "age_seconds": machine_age_seconds(machine),
        "report": machine.report,
        "runs": runs,
        # What it can train, by name ([] where its report has no catalogue), and as the page
        # shows it (catalogue.catalogue_card).
        "models": list(catalogue.models) if catalogue.reported else [],
        "datasets": list(catalogue.datasets) if catalogue.reported else [],
        "catalogue": catalogue_card(catalogue),
        # What the page says of it now, in words: who holds which cores and GPUs, how busy.
        "now": machine_now(machine, holds=holds or []),
    }


def running_holds(*, user: Any) -> dict[str, list[dict[str, Any]]]:
    """Per machine, the running runs there with the cores and GPUs each holds, as the claim
    counts them (scheduling/allocation.py); only the runs the user may open are named."""
    from dashboard.experiments.core.access import experiment_can_control
    from dashboard.experiments.models import Experiment, Status
    from dashboard.experiments.scheduling.allocation import run_cpu_threads

    counts = {
        m.hostname: int((m.report or {}).get("cpu_count") or 1) for m in WorkerMachine.objects.all()
    }
    by_machine: dict[str, list[dict[str, Any]]] = {}
    running = Experiment.objects.filter(status=Status.RUNNING).exclude(worker="")
    for run in running.order_by("id"):
        named = experiment_can_control(experiment=run, user=user)
        for worker, ranks in _run_machines(run):
            cores = run_cpu_threads(
                strategy=run.strategy, processes=run.processes, gpus=run.gpus or [],
                cpu_count=counts.get(worker, 1),
            )  # fmt: skip
            gpus = sorted(run.gpus or [])
            held = [plural(cores, "core")] if cores else []
            if gpus:
                held.append(f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}")
            by_machine.setdefault(worker, []).append({
                "id": run.pk if named else None,
                "name": run.name if named else None,
                "url": run.get_absolute_url() if named else None,
                "label": f"#{run.pk} {run.name}" if named else "another user's run",
                "strategy": run.strategy,
                "cores": cores,
                "gpus": gpus,
                "ranks_text": ranks,
                "held_text": " and ".join(held) or "nothing counted",
            })  # fmt: skip
    return by_machine


def machine_now(machine: WorkerMachine, *, holds: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's live lines of a machine: its cores and GPUs held and by whom, how busy its
    CPU and each GPU are (its last report), and the GPU status in words."""
    report = machine.report or {}
    cpu_count = report.get("cpu_count")
    cores = sum(int(hold["cores"]) for hold in holds)
    holders: dict[str, str] = {}
    for hold in holds:
        for gpu in hold["gpus"]:
            holders[str(gpu)] = hold["label"]
    if holds:
        held = f"{cores} of {cpu_count or '?'} cores"
        if holders:
            held += f" and {plural(len(holders), 'GPU')}"
        held += f" held by {plural(len(holds), 'run')}"
    else:
        held = "nothing held: no run is running here"
    percent, load = report.get("cpu_percent"), report.get("load_average")
    busy = "not reported" if percent is None else f"{percent:.0f} % of all cores"
    if load is not None:
        busy += f" (load {load:.2f} over a minute)"
    return {
        "holds": holds,
        "held_text": held,
        "cpu_busy_text": busy,
        "gpu_holders": holders,
        "gpu_status_text": gpu_status_text(report.get("gpu_status")),
        "sharing_text": _sharing_text(report.get("shared_memory") or {}),
    }


def _sharing_text(shm: dict[str, Any]) -> str:
    """Whether a tensor shares through shared memory here (the worker's check at each report),
    said in words: the check's tensor is the worker's own, no run's."""
    checks = shm.get("shared_tensors") or []
    if not checks:
        return "not checked"
    failed = [str(c.get("error") or "") for c in checks if not c.get("is_shared")]
    return f"fails: {failed[0] or 'not shared'}" if failed else "works (checked at each report)"


def running_shared_tensors(*, user: Any) -> dict[str, list[dict[str, Any]]]:
    """Per machine, the shared tensors of the runs running there, as their `started` said.

    Everyone sees the memory a machine holds; only the runs the user may open are named.
    """
    from dashboard.experiments.core.access import experiment_can_control
    from dashboard.experiments.models import Experiment, Status

    by_machine: dict[str, list[dict[str, Any]]] = {}
    running = Experiment.objects.filter(status=Status.RUNNING).exclude(worker="")
    for run in running.order_by("id"):
        tensors = (run.run_info or {}).get("shared_tensors")
        if not isinstance(tensors, list) or not tensors:
            continue
        named = experiment_can_control(experiment=run, user=user)
        rows = [
            {**tensor, "bytes_text": bytes_text(tensor.get("bytes"))}
            for tensor in tensors
            if isinstance(tensor, dict)
        ]
        shared = sum(
            t["bytes"] for t in rows if t.get("is_shared") and isinstance(t.get("bytes"), int)
        )
        item = {
            "id": run.pk if named else None,
            "name": run.name if named else None,
            "url": run.get_absolute_url() if named else None,
            "strategy": run.strategy,
            "shared_tensors": rows,
            "shared_bytes": shared,
            "shared_text": bytes_text(shared),
        }
        for worker, ranks in _run_machines(run):
            by_machine.setdefault(worker, []).append({**item, "ranks_text": ranks})
    return by_machine


def _run_machines(run: Any) -> list[tuple[str, str]]:
    """The machines a run is on, each with the global ranks it runs ("" on one machine): a run
    over several machines holds its own copy of the data on each."""
    placement = [p for p in run.placement or [] if isinstance(p, dict) and p.get("worker")]
    if len(placement) < 2:
        return [(run.worker, "")]
    return [(str(p["worker"]), ranks_text(p["ranks"]) if p.get("ranks") else "") for p in placement]


def gpu_card(gpu: dict[str, Any]) -> dict[str, Any]:
    used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
    utilization = gpu.get("utilization_percent")
    return {
        **gpu,
        "memory_text": f"{bytes_text(used)} / {bytes_text(total)}",
        "utilization_text": "?" if utilization is None else f"{utilization} %",
    }


def shm_card(shm: dict[str, Any]) -> dict[str, Any]:
    total = shm.get("total_bytes")
    return {
        **shm,
        "total_text": bytes_text(total),
        "used_text": bytes_text(shm.get("used_bytes")),
        "free_text": bytes_text(shm.get("free_bytes")),
        "low": shm.get("present", False) and total is not None and total < SHM_LOW_BYTES,
        "strategies_text": ", ".join(shm.get("sharing_strategies") or []) or "?",
    }


def machine_card(
    machine: WorkerMachine, *, runs: list[dict[str, Any]], holds: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The page's view of one machine; static/js/devices.js renders the same from the API."""
    report = machine.report or {}
    memory = report.get("memory") or {}
    torch_facts = report.get("torch") or {}
    now = machine_now(machine, holds=holds or [])
    return {
        "hostname": machine.hostname,
        "address": machine.address,
        "online": machine.is_online,
        "age_seconds": machine_age_seconds(machine),
        "reported_at": machine.reported_at,
        "cpu_count": report.get("cpu_count"),
        "memory_text": (
            f"{bytes_text(memory.get('available_bytes'))} available "
            f"of {bytes_text(memory.get('total_bytes'))}"
        ),
        "gpus": [
            {**gpu_card(gpu), "held_by": now["gpu_holders"].get(str(gpu.get("index")))}
            for gpu in report.get("gpus") or []
        ],
        "now": now,
        "cuda_device_order": report.get("cuda_device_order"),
        "torch": torch_facts,
        "backends": sorted((torch_facts.get("distributed_backends") or {}).items()),
        "shm": shm_card(report.get("shared_memory") or {}),
        "runs": runs,
        "catalogue": catalogue_card(catalogue_of(machine)),
    }


def device_list(request: HttpRequest) -> HttpResponse:
    machines = WorkerMachine.objects.all()
    runs = running_shared_tensors(user=request.user)
    holds = running_holds(user=request.user)
    return render(
        request,
        "devices/device_list.html",
        {
            "cards": [
                machine_card(
                    machine,
                    runs=runs.get(machine.hostname, []),
                    holds=holds.get(machine.hostname, []),
                )
                for machine in machines
            ],
            "stale_seconds": settings.TRAINYARD_WORKER_STALE_SECONDS,
            "poll_seconds": POLL_SECONDS,
            "slurm": slurm_cluster_facts(user=request.user),  # None: no Slurm configured
        },
    )


@router.get("/devices/", url_name="api-devices", response={200: MachinesOut, **errors()})
def api_devices(request: HttpRequest) -> HttpResponse:
    """What every worker machine last reported: CPUs, memory, GPUs, shared memory, its runs."""
    machines = WorkerMachine.objects.all()
    runs = running_shared_tensors(user=request.user)
    holds = running_holds(user=request.user)
    items = [
        machine_api_item(m, runs=runs.get(m.hostname, []), holds=holds.get(m.hostname, []))
        for m in machines
    ]
    return JsonResponse({"machines": items})
