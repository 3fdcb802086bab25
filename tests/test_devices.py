"""Worker machines: facts, reports, the reporter thread, capacity checks, the page and the API."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pynvml
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.devices import facts as facts_module
from dashboard.devices import reporter as reporter_module
from dashboard.devices.capacity import capacity_check, capacity_summary
from dashboard.devices.facts import machine_facts_collect
from dashboard.devices.models import WorkerMachine
from dashboard.devices.reporter import MachineReporter, machine_report_save
from training.registry import STRATEGY_NAMES


def nvml_gpu_count() -> int:
    """GPUs NVML sees on this machine; 0 when there is no driver or library."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


HAS_NVML_GPU = nvml_gpu_count() > 0


# --- fixtures (tests/conftest.py will take the shared ones over) ---


@pytest.fixture
def user(db: None) -> Any:
    return get_user_model().objects.create_user(username="alice", password="s3cret-pass-word")


@pytest.fixture
def client_logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def nvml_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget that NVML was initialised, so that the next collect calls nvmlInit again."""
    monkeypatch.setattr(facts_module, "_nvml_initialised", False)


@pytest.fixture
def reporter_reset() -> Any:
    yield
    reporter_module.reporter_stop()


def report_make(
    *, hostname: str, cpu_count: int = 2, gpu_ids: tuple[int, ...] = (), shm_total: int = 2**34
) -> dict[str, Any]:
    """A report as a worker writes it, with made-up GPUs where a test needs them."""
    gpus = [
        {
            "index": index,
            "uuid": f"GPU-{hostname}-{index}",
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": f"00000000:{index + 1:02X}:00.0",
            "memory_total_bytes": 80 * 1024**3,
            "memory_used_bytes": 1024**3,
            "utilization_percent": 7,
        }
        for index in gpu_ids
    ]
    return {
        "hostname": hostname,
        "collected_at": timezone.now().isoformat(),
        "cpu_count": cpu_count,
        "memory": {"total_bytes": 16 * 1024**3, "available_bytes": 8 * 1024**3},
        "gpus": gpus,
        "gpu_status": f"{len(gpus)} GPUs through NVML" if gpus else "no GPU: Driver Not Loaded",
        "torch": {
            "version": "2.14.1",
            "cuda_compiled": "13.0",
            "distributed_available": True,
            "distributed_backends": {"nccl": True, "gloo": True, "mpi": False},
        },
        "shared_memory": {
            "path": "/dev/shm",
            "present": True,
            "total_bytes": shm_total,
            "used_bytes": 0,
            "free_bytes": shm_total,
            "sharing_strategy": "file_descriptor",
            "sharing_strategies": ["file_descriptor", "file_system"],
            "shared_tensors": [
                {"name": "probe", "is_shared": True, "dtype": "float32", "shape": [16], "bytes": 64}
            ],
        },
    }


def machine_make(*, hostname: str, age_seconds: float = 0, **report: Any) -> WorkerMachine:
    return WorkerMachine.objects.create(
        hostname=hostname,
        report=report_make(hostname=hostname, **report),
        reported_at=timezone.now() - timedelta(seconds=age_seconds),
    )


# --- facts ---


def test_facts_describe_this_machine() -> None:
    import torch

    facts = machine_facts_collect()

    assert facts["hostname"]
    assert facts["cpu_count"] >= 1
    assert 0 < facts["memory"]["available_bytes"] <= facts["memory"]["total_bytes"]
    assert facts["torch"]["version"] == torch.__version__
    assert facts["torch"]["distributed_available"] is True
    assert facts["torch"]["distributed_backends"]["gloo"] is True
    assert {"nccl", "gloo", "mpi"} <= set(facts["torch"]["distributed_backends"])
    shm = facts["shared_memory"]
    assert shm["present"] is True
    assert shm["total_bytes"] > 0 and shm["free_bytes"] > 0 and shm["used_bytes"] >= 0
    assert "file_descriptor" in shm["sharing_strategies"]
    assert shm["sharing_strategy"] in shm["sharing_strategies"]
    [probe] = shm["shared_tensors"]
    assert probe == {
        "name": "probe",
        "is_shared": True,
        "dtype": "float32",
        "shape": [16],
        "bytes": 64,
    }
    # The worker's main process forks the pool: collecting facts must never initialise CUDA.
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(HAS_NVML_GPU, reason="this machine has NVML GPUs")
def test_facts_say_no_gpu_plainly_without_nvml() -> None:
    facts = machine_facts_collect()

    assert facts["gpus"] == []
    assert facts["gpu_status"].startswith("no GPU (")
    assert len(facts["gpu_status"]) > len("no GPU ()")


def test_facts_when_nvml_init_fails(monkeypatch: pytest.MonkeyPatch, nvml_fresh: None) -> None:
    def nvml_init_broken() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", nvml_init_broken)

    facts = machine_facts_collect(with_torch=False)

    assert facts["gpus"] == []
    assert facts["gpu_status"] == "no GPU (NVIDIA's driver is not loaded)"
    assert "torch" not in facts  # the web process's fallback does not import torch


def test_facts_say_nvidias_library_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, nvml_fresh: None
) -> None:
    """Issue 34 item 14: not NVML's "NVML Shared Library Not Found"."""

    def nvml_init_missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", nvml_init_missing)

    facts = machine_facts_collect(with_torch=False)

    assert facts["gpu_status"] == "no GPU (NVIDIA's library is not installed)"
    assert 0 <= facts["cpu_percent"] <= 100 and facts["load_average"] >= 0


def test_facts_read_gpus_through_nvml(monkeypatch: pytest.MonkeyPatch, nvml_fresh: None) -> None:
    """Two fake GPUs; the second cannot report utilization (NVML says not supported)."""

    class Memory:
        total, used = 80 * 1024**3, 2 * 1024**3

    class Utilization:
        gpu = 42

    class Pci:
        def __init__(self, index: int) -> None:
            self.busId = f"00000000:{index + 0x17:02X}:00.0"

    def utilization(handle: int) -> Utilization:
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return Utilization()

    fake = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetMemoryInfo": lambda handle: Memory(),
        "nvmlDeviceGetUtilizationRates": utilization,
        "nvmlDeviceGetPciInfo": Pci,
        "nvmlDeviceGetUUID": lambda handle: f"GPU-uuid-{handle}",
        "nvmlDeviceGetName": lambda handle: b"NVIDIA H100",  # old bindings return bytes
        "nvmlSystemGetDriverVersion": lambda: "570.86.15",
    }
    for name, value in fake.items():
        monkeypatch.setattr(pynvml, name, value)

    facts = machine_facts_collect(with_torch=False)

    assert facts["gpu_status"] == "2 GPUs through NVML"
    assert facts["nvml_driver_version"] == "570.86.15"
    assert facts["gpus"][0] == {
        "index": 0,
        "uuid": "GPU-uuid-0",
        "name": "NVIDIA H100",
        "pci_bus_id": "00000000:17:00.0",
        "memory_total_bytes": 80 * 1024**3,
        "memory_used_bytes": 2 * 1024**3,
        "utilization_percent": 42,
    }
    assert facts["gpus"][1]["utilization_percent"] is None
    assert facts["gpus"][1]["pci_bus_id"] == "00000000:18:00.0"


def test_facts_hostname_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_WORKER_NAME", "worker-7")

    assert machine_facts_collect(with_torch=False)["hostname"] == "worker-7"


def test_facts_static_part_is_computed_once() -> None:
    machine_facts_collect()
    hits = facts_module.torch_facts_static.cache_info().hits

    machine_facts_collect()

    assert facts_module.torch_facts_static.cache_info().hits == hits + 1


def test_facts_say_when_dev_shm_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(facts_module, "SHM_PATH", "/nonexistent/shm")

    shm = facts_module.shm_usage_collect()

    assert shm["present"] is False
    assert shm["status"].startswith("no /nonexistent/shm on this machine")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_NVML_GPU, reason="no GPU visible through NVML on this machine")
def test_facts_match_nvml_on_a_gpu_machine() -> None:
    import torch

    facts = machine_facts_collect()

    assert len(facts["gpus"]) == nvml_gpu_count()
    assert facts["gpu_status"].endswith("through NVML")
    for index, gpu in enumerate(facts["gpus"]):
        assert gpu["index"] == index
        assert gpu["uuid"].startswith("GPU-")
        assert gpu["name"]
        assert gpu["pci_bus_id"]
        assert gpu["memory_total_bytes"] > 0
        assert 0 <= gpu["memory_used_bytes"] <= gpu["memory_total_bytes"]
        assert gpu["utilization_percent"] is None or 0 <= gpu["utilization_percent"] <= 100
    assert not torch.cuda.is_initialized()


# --- reporter ---


@pytest.mark.django_db
def test_report_save_upserts_by_hostname() -> None:
    first = machine_report_save(facts=report_make(hostname="host-a", cpu_count=2))
    second = machine_report_save(facts=report_make(hostname="host-a", cpu_count=4))

    assert WorkerMachine.objects.count() == 1
    assert second.pk == first.pk
    assert second.report["cpu_count"] == 4
    assert second.reported_at >= first.reported_at
    assert second.is_online


def machine_wait(*, hostname: str, seconds: float = 15) -> WorkerMachine | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        machine = WorkerMachine.objects.filter(hostname=hostname).first()
        if machine is not None:
            return machine
        time.sleep(0.1)
    return None


@pytest.mark.django_db(transaction=True)
def test_reporter_thread_saves_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_WORKER_NAME", "thread-host")
    reporter = MachineReporter(interval=0.2)
    reporter.start()
    try:
        machine = machine_wait(hostname="thread-host")
        assert machine is not None, "the reporter thread saved nothing"
        assert machine.report["shared_memory"]["shared_tensors"][0]["is_shared"] is True
        first_at = machine.reported_at
        deadline = time.monotonic() + 10
        while machine.reported_at == first_at and time.monotonic() < deadline:
            time.sleep(0.1)
            machine.refresh_from_db()
        assert machine.reported_at > first_at, "the reporter reported only once"
    finally:
        reporter.stop()
    assert not reporter.is_alive()


@pytest.mark.django_db(transaction=True)
def test_reporter_thread_survives_a_failed_report(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def facts_flaky(**kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first report breaks")
        return report_make(hostname="flaky-host")

    monkeypatch.setattr(reporter_module, "machine_facts_collect", facts_flaky)
    reporter = MachineReporter(interval=0.1)
    reporter.start()
    try:
        assert machine_wait(hostname="flaky-host") is not None
        assert reporter.is_alive()
    finally:
        reporter.stop()


@pytest.mark.django_db(transaction=True)
def test_celery_worker_signals_start_and_stop_the_reporter(
    monkeypatch: pytest.MonkeyPatch, reporter_reset: None
) -> None:
    from celery.signals import worker_ready, worker_shutdown

    from dashboard.devices import worker

    # DevicesConfig.ready() imported the hookup, so `celery -A dashboard worker` has it too.
    assert any(receiver() is worker.worker_ready_report for _, receiver in worker_ready.receivers)
    monkeypatch.setenv("TRAINYARD_WORKER_NAME", "signal-host")

    worker_ready.send(sender=None)
    reporter = reporter_module._reporter
    assert reporter is not None and reporter.is_alive()
    assert machine_wait(hostname="signal-host") is not None

    worker_shutdown.send(sender=None)
    assert reporter_module._reporter is None
    assert not reporter.is_alive()


# --- capacity ---


@pytest.mark.django_db
def test_capacity_summary_from_online_workers() -> None:
    machine_make(hostname="cpu-box", cpu_count=8)
    machine_make(hostname="gpu-node-1", cpu_count=4, gpu_ids=(0, 1))
    machine_make(hostname="gone", cpu_count=64, gpu_ids=(0, 1, 2, 3), age_seconds=3600)

    capacity = capacity_summary()

    assert capacity.source == "workers"
    assert [m.hostname for m in capacity.machines] == ["cpu-box", "gpu-node-1"]
    assert capacity.max_cpu_count == 8
    assert capacity.max_gpu_count == 2
    assert capacity.gpu_ids_by_machine == {"cpu-box": [], "gpu-node-1": [0, 1]}


@pytest.mark.django_db
def test_capacity_summary_falls_back_to_the_web_process() -> None:
    machine_make(hostname="gone", cpu_count=64, age_seconds=3600)

    capacity = capacity_summary()

    assert capacity.source == "web"
    assert "no worker" in capacity.source_note
    [own] = capacity.machines
    assert own.cpu_count == facts_module.cpu_count_usable()
    assert len(own.gpu_ids) == nvml_gpu_count()


@pytest.mark.django_db
def test_capacity_check_ddp_on_cpu() -> None:
    machine_make(hostname="host-a", cpu_count=2)

    assert capacity_check(strategy="ddp", processes=2, gpus=[]) == []
    assert capacity_check(strategy="ddp", processes=8, gpus=[]) == [
        "DDP asks for 8 processes but the largest worker (host-a) has 2 CPU cores and no GPU"
    ]


@pytest.mark.django_db
def test_capacity_check_ddp_on_cpu_uses_the_largest_machine() -> None:
    machine_make(hostname="host-a", cpu_count=2)
    machine_make(hostname="host-b", cpu_count=16, gpu_ids=(0,))

    assert capacity_check(strategy="ddp", processes=16, gpus=[]) == []
    assert capacity_check(strategy="ddp", processes=17, gpus=[]) == [
        "DDP asks for 17 processes but the largest worker (host-b) has 16 CPU cores and GPU 0"
    ]


@pytest.mark.django_db
def test_capacity_check_without_workers_uses_the_web_process() -> None:
    cores = facts_module.cpu_count_usable()

    assert capacity_check(strategy="ddp", processes=cores, gpus=[]) == []
    [message] = capacity_check(strategy="ddp", processes=cores + 1, gpus=[])
    assert "no worker is online and this web server" in message
    assert f"has {cores} CPU core" in message


@pytest.mark.django_db
def test_capacity_check_ddp_with_gpus() -> None:
    machine_make(hostname="gpu-node-1", cpu_count=4, gpu_ids=(0, 1))

    assert capacity_check(strategy="ddp", processes=2, gpus=[0, 1]) == []
    assert capacity_check(strategy="ddp", processes=4, gpus=[0, 1]) == [
        "DDP runs one process per GPU: 4 processes for 2 GPUs (GPUs 0, 1)"
    ]
    assert capacity_check(strategy="ddp", processes=2, gpus=[0, 3]) == [
        "GPU 3 does not exist: gpu-node-1 has GPUs 0, 1"
    ]
    assert capacity_check(strategy="ddp", processes=2, gpus=[3, 4]) == [
        "GPUs 3, 4 do not exist: gpu-node-1 has GPUs 0, 1"
    ]


@pytest.mark.django_db
def test_capacity_check_gpus_must_be_on_one_machine() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1))
    machine_make(hostname="gpu-node-2", gpu_ids=(0, 1, 2))
    machine_make(hostname="cpu-box")

    assert capacity_check(strategy="ddp", processes=3, gpus=[0, 1, 2]) == []
    assert capacity_check(strategy="dp", processes=1, gpus=[2, 5]) == [
        "GPU 5 does not exist on any online worker: cpu-box has no GPU; "
        "gpu-node-1 has GPUs 0, 1; gpu-node-2 has GPUs 0, 1, 2"
    ]


@pytest.mark.django_db
def test_capacity_check_gpus_split_across_machines() -> None:
    # Every id exists somewhere but never all on one machine: a run does not span machines.
    machine_make(hostname="node-a", gpu_ids=(0, 2))
    machine_make(hostname="node-b", gpu_ids=(0, 1))

    assert capacity_check(strategy="dp", processes=1, gpus=[1, 2]) == [
        "GPUs 1, 2 are not all on one machine: node-a has GPUs 0, 2; node-b has GPUs 0, 1"
    ]


@pytest.mark.django_db
def test_capacity_check_dp_with_gpus() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1))

    assert capacity_check(strategy="dp", processes=1, gpus=[0, 1]) == []
    assert capacity_check(strategy="dp", processes=1, gpus=[1]) == []
    assert capacity_check(strategy="dp", processes=1, gpus=[0, 2]) == [
        "GPU 2 does not exist: gpu-node-1 has GPUs 0, 1"
    ]


@pytest.mark.django_db
def test_capacity_check_single() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1))

    assert capacity_check(strategy="single", processes=1, gpus=[]) == []
    assert capacity_check(strategy="single", processes=1, gpus=[1]) == []
    assert capacity_check(strategy="single", processes=1, gpus=[0, 1]) == [
        "a single-device run uses one GPU, not 2 (GPUs 0, 1)"
    ]
    assert capacity_check(strategy="single", processes=1, gpus=[7]) == [
        "GPU 7 does not exist: gpu-node-1 has GPUs 0, 1"
    ]


@pytest.mark.django_db
def test_capacity_check_gpu_on_a_cpu_only_worker() -> None:
    machine_make(hostname="host-a", cpu_count=2)

    assert capacity_check(strategy="single", processes=1, gpus=[0]) == [
        "GPU 0 does not exist: host-a has no GPU"
    ]


@pytest.mark.django_db
def test_capacity_check_rejects_malformed_requests() -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0, 1))

    # The known names come from the registry, which grows: matched on its own list.
    assert capacity_check(strategy="megatron", processes=1, gpus=[]) == [
        f"unknown strategy 'megatron': use one of {', '.join(STRATEGY_NAMES)}"
    ]
    assert capacity_check(strategy="ddp", processes=0, gpus=[]) == [
        "processes must be at least 1, not 0"
    ]
    assert capacity_check(strategy="dp", processes=1, gpus=[0, 0]) == [
        "GPU 0 listed more than once"
    ]
    assert capacity_check(strategy="dp", processes=1, gpus=[-1]) == [
        "GPU ids are whole numbers from 0: [-1] are not"
    ]


# --- page, API, admin ---


@pytest.mark.django_db
def test_device_page_requires_login(client: Client) -> None:
    response = client.get(reverse("device-list"))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_device_page_shows_each_machine(client_logged_in: Client) -> None:
    machine_make(hostname="gpu-node-1", cpu_count=4, gpu_ids=(0, 1))
    machine_make(hostname="old-box", age_seconds=3600)

    response = client_logged_in.get(reverse("device-list"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "gpu-node-1" in html and "old-box" in html
    assert "online" in html and "offline" in html
    assert re.search(r"last report [0-2] s ago", html)
    assert "last report 3600 s ago" in html
    assert "NVIDIA H100 80GB HBM3" in html
    assert "1.0 GiB / 80.0 GiB" in html
    # An old report's NVML words said plainly.
    assert "no GPU (NVIDIA&#x27;s driver is not loaded)" in html
    assert "file_descriptor, file_system" in html
    assert "nccl yes" in html and "mpi no" in html
    assert "Bus error" not in html  # 16 GiB of /dev/shm needs no hint
    assert reverse("api-devices") in html  # where the page's script polls


def test_device_page_says_which_runs_hold_which_cores_and_gpus(
    client_logged_in: Client, user: Any, experiment_factory: Any
) -> None:
    """Issue 34 item 14: who holds what now, how busy, no probe tensor, the GPU status plainly;
    another user's run is not named."""
    from dashboard.experiments.models import Status

    machine_make(hostname="gpu-node-1", cpu_count=4, gpu_ids=(0, 1))
    cpu_box = machine_make(hostname="cpu-box", cpu_count=4)
    cpu_box.report = {**cpu_box.report, "cpu_percent": 37.4, "load_average": 1.5,
                      "gpu_status": "no GPU: NVML Shared Library Not Found"}  # fmt: skip
    cpu_box.save()
    mine = experiment_factory(
        owner=user, name="mine", strategy="ddp", processes=2, gpus=[1],
        status=Status.RUNNING, worker="gpu-node-1",
    )  # fmt: skip
    other = get_user_model().objects.create_user(username="bob", password="s3cret-pass-word")
    experiment_factory(
        owner=other, name="bobs", strategy="ddp", processes=2, gpus=[],
        status=Status.RUNNING, worker="cpu-box",
    )  # fmt: skip

    html = client_logged_in.get(reverse("device-list")).content.decode()
    assert f"#{mine.pk} mine" in html and "bobs" not in html
    assert "0 of 4 cores and 1 GPU held by 1 run" in html
    assert "2 of 4 cores held by 1 run" in html and "another user&#x27;s run" in html
    assert "37 % of all cores (load 1.50 over a minute)" in html
    assert "no GPU (NVIDIA&#x27;s library is not installed)" in html
    assert "NVML Shared Library Not Found" not in html
    assert "probe" not in html and "works (checked at each report)" in html

    machines = {
        m["hostname"]: m for m in client_logged_in.get(reverse("api-devices")).json()["machines"]
    }
    now = machines["gpu-node-1"]["now"]
    assert now["gpu_holders"] == {"1": f"#{mine.pk} mine"}
    assert [(h["label"], h["gpus"], h["held_text"]) for h in now["holds"]] == [
        (f"#{mine.pk} mine", [1], "GPU 1")
    ]
    assert machines["cpu-box"]["now"]["holds"][0]["held_text"] == "2 cores"
    assert machines["cpu-box"]["now"]["gpu_status_text"] == (
        "no GPU (NVIDIA's library is not installed)"
    )


def test_device_page_warns_about_a_small_dev_shm(client_logged_in: Client) -> None:
    machine_make(hostname="docker-box", shm_total=64 * 1024**2)

    html = client_logged_in.get(reverse("device-list")).content.decode()

    assert "64.0 MiB" in html
    assert "Bus error" in html


def test_device_page_empty_state(client_logged_in: Client) -> None:
    html = client_logged_in.get(reverse("device-list")).content.decode()

    assert "No worker has reported yet" in html
    assert "celery -A dashboard worker" in html


@pytest.mark.django_db
def test_api_devices_requires_login(client: Client) -> None:
    response = client.get(reverse("api-devices"))

    assert response.status_code == 401
    assert "error" in response.json()


def test_api_devices_lists_machines(client_logged_in: Client) -> None:
    machine_make(hostname="gpu-node-1", gpu_ids=(0,))
    machine_make(hostname="old-box", age_seconds=3600)

    response = client_logged_in.get(reverse("api-devices"))

    assert response.status_code == 200
    machines = response.json()["machines"]
    assert [m["hostname"] for m in machines] == ["gpu-node-1", "old-box"]
    assert [m["online"] for m in machines] == [True, False]
    assert {"hostname", "online", "reported_at", "report"} <= set(machines[0])
    assert machines[0]["report"]["gpus"][0]["uuid"] == "GPU-gpu-node-1-0"
    assert client_logged_in.post(reverse("api-devices")).status_code == 405


def test_api_devices_accepts_a_token(user: Any) -> None:
    from dashboard.accounts.models import ApiToken

    token = ApiToken.objects.create(user=user, name="script")
    machine_make(hostname="host-a")

    response = Client().get(reverse("api-devices"), HTTP_AUTHORIZATION=f"Bearer {token.key}")

    assert response.status_code == 200
    assert response.json()["machines"][0]["hostname"] == "host-a"


def test_admin_lists_machines_read_only(admin_client: Client) -> None:
    machine = machine_make(hostname="host-a")

    listing = admin_client.get(reverse("admin:devices_workermachine_changelist"))
    add = admin_client.get(reverse("admin:devices_workermachine_add"))
    detail = admin_client.get(reverse("admin:devices_workermachine_change", args=[machine.pk]))

    assert listing.status_code == 200 and "host-a" in listing.content.decode()
    assert add.status_code == 403
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()
