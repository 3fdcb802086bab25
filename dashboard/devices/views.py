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
from dashboard.texts import bytes_text, ranks_text

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


class MachinesOut(Schema):
    machines: list[MachineOut]


def machine_age_seconds(machine: WorkerMachine) -> int:
    return max(0, int((timezone.now() - machine.reported_at).total_seconds()))


def machine_api_item(machine: WorkerMachine, *, runs: list[dict[str, Any]]) -> dict[str, Any]:
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
    }


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
        "tensors": [
            {**tensor, "bytes_text": bytes_text(tensor.get("bytes"))}
            for tensor in shm.get("shared_tensors") or []
        ],
    }


def machine_card(machine: WorkerMachine, *, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's view of one machine; static/js/devices.js renders the same from the API."""
    report = machine.report or {}
    memory = report.get("memory") or {}
    torch_facts = report.get("torch") or {}
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
        "gpus": [gpu_card(gpu) for gpu in report.get("gpus") or []],
        "gpu_status": report.get("gpu_status") or "no GPU: not reported",
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
    return render(
        request,
        "devices/device_list.html",
        {
            "cards": [
                machine_card(machine, runs=runs.get(machine.hostname, [])) for machine in machines
            ],
            "stale_seconds": settings.TRAINYARD_WORKER_STALE_SECONDS,
            "poll_seconds": POLL_SECONDS,
        },
    )


@router.get("/devices/", url_name="api-devices", response={200: MachinesOut, **errors()})
def api_devices(request: HttpRequest) -> HttpResponse:
    """What every worker machine last reported: CPUs, memory, GPUs, shared memory, its runs."""
    machines = WorkerMachine.objects.all()
    runs = running_shared_tensors(user=request.user)
    items = [machine_api_item(m, runs=runs.get(m.hostname, [])) for m in machines]
    return JsonResponse({"machines": items})
