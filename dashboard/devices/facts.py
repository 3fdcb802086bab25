"""What a machine can offer for training: CPUs, memory, GPUs, torch and shared memory.

Runs inside the Celery worker's main process, which forks the pool: no call here may initialise
CUDA (pytorch#40403). GPUs are read through NVML, torch only for what it was built with.
Facts that cannot change while a process lives are computed once; the rest is cheap to re-read
every few seconds.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pynvml

from dashboard.texts import NO_GPU_DEVICE, no_gpu_text

logger = logging.getLogger(__name__)

SHM_PATH = "/dev/shm"  # noqa: S108 - the POSIX shared memory mount, not a temporary file
# Below this, DataLoader workers die with "Bus error" on real batches (pytorch#5040).
SHM_LOW_BYTES = 1024**3
PROBE_ELEMENTS = 16
DISTRIBUTED_BACKENDS = ("nccl", "gloo", "mpi", "ucc")

# NVML stays initialised for the life of the process: nvmlInit can take seconds per GPU when
# persistence mode is off, too much for a report every few seconds.
_nvml_initialised = False


def machine_name() -> str:
    """The name this worker reports its machine under and claims runs under (the run's
    `worker`): one name for both, so the allocation finds its runs on the machine it reported.
    Several test workers on one host need their own (TRAINYARD_WORKER_NAME)."""
    return os.environ.get("TRAINYARD_WORKER_NAME") or socket.gethostname()


def machine_queue(name: str) -> str:
    """The Celery queue only `name`'s worker consumes (beside the shared one): a node's task of
    a multi-node run, or a run pinned to that machine, is sent there."""
    return f"machine.{name}"


def worker_address() -> str:
    """Where other machines reach this one: TRAINYARD_WORKER_ADDRESS, else the source address
    of this host's route to the broker (the interface the other workers share a network with;
    a connected UDP socket picks it from the routing table and sends nothing)."""
    configured = os.environ.get("TRAINYARD_WORKER_ADDRESS", "").strip()
    if configured:
        return configured
    from urllib.parse import urlsplit

    from django.conf import settings

    broker = urlsplit(str(settings.CELERY_BROKER_URL))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((broker.hostname or "127.0.0.1", broker.port or 6379))
            return str(probe.getsockname()[0])
    except OSError:
        logger.warning("no route to the broker %s; reporting this host's name", broker.hostname)
        return socket.gethostname()


def cpu_count_usable() -> int:
    # The affinity mask is what this process may actually run on (taskset, cgroups cpusets).
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def nvml_ensure() -> None:
    global _nvml_initialised
    if not _nvml_initialised:
        pynvml.nvmlInit()
        _nvml_initialised = True


def _text(value: str | bytes) -> str:
    # Old pynvml releases return bytes, nvidia-ml-py returns str.
    return value.decode() if isinstance(value, bytes) else value


def _nvml_read(call: Any, *args: Any) -> Any:
    """One NVML field; a field the GPU does not support is None, not a failed report."""
    try:
        return call(*args)
    except pynvml.NVMLError as exc:
        logger.debug("NVML %s failed: %s", getattr(call, "__name__", call), exc)
        return None


def gpu_facts_collect_one(*, index: int) -> dict[str, Any]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = _nvml_read(pynvml.nvmlDeviceGetMemoryInfo, handle)
    utilization = _nvml_read(pynvml.nvmlDeviceGetUtilizationRates, handle)
    pci = _nvml_read(pynvml.nvmlDeviceGetPciInfo, handle)
    uuid = _nvml_read(pynvml.nvmlDeviceGetUUID, handle)
    name = _nvml_read(pynvml.nvmlDeviceGetName, handle)
    return {
        # NVML numbers GPUs in PCI bus order; CUDA agrees only with CUDA_DEVICE_ORDER=PCI_BUS_ID.
        "index": index,
        "uuid": _text(uuid) if uuid is not None else None,
        "name": _text(name) if name is not None else None,
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "memory_total_bytes": int(memory.total) if memory is not None else None,
        "memory_used_bytes": int(memory.used) if memory is not None else None,
        "utilization_percent": int(utilization.gpu) if utilization is not None else None,
    }


def gpu_facts_collect() -> dict[str, Any]:
    """GPUs as NVML sees them, or a plain sentence saying why there are none."""
    try:
        nvml_ensure()
        count = pynvml.nvmlDeviceGetCount()
        gpus = [gpu_facts_collect_one(index=index) for index in range(count)]
        driver = _nvml_read(pynvml.nvmlSystemGetDriverVersion)
    except pynvml.NVMLError as exc:
        return {"gpus": [], "gpu_status": no_gpu_text(str(exc)), "nvml_driver_version": None}
    if not gpus:
        status = NO_GPU_DEVICE
    else:
        status = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} through NVML"
    return {
        "gpus": gpus,
        "gpu_status": status,
        "nvml_driver_version": _text(driver) if driver is not None else None,
    }


def machine_samples_collect(*, worker: str) -> dict[str, float]:
    """This machine's load now, as series values (keys of the series contract): CPU percent
    since the previous call (psutil's first call says 0: call once to prime it), and through
    NVML each GPU's utilisation (percent) and memory in use (bytes). A machine without NVML
    gives its CPU alone. No CUDA call: this runs in the supervising worker."""
    samples = {f"machine/{worker}/cpu_percent": float(psutil.cpu_percent(interval=None))}
    try:
        nvml_ensure()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return samples
    for index in range(count):
        handle = _nvml_read(pynvml.nvmlDeviceGetHandleByIndex, index)
        memory = _nvml_read(pynvml.nvmlDeviceGetMemoryInfo, handle) if handle else None
        utilization = _nvml_read(pynvml.nvmlDeviceGetUtilizationRates, handle) if handle else None
        if utilization is not None:
            samples[f"gpu/{worker}/{index}/utilization"] = float(utilization.gpu)
        if memory is not None:
            samples[f"gpu/{worker}/{index}/memory_bytes"] = float(memory.used)
    return samples


def shm_usage_collect() -> dict[str, Any]:
    try:
        usage = shutil.disk_usage(SHM_PATH)
    except OSError as exc:
        return {
            "path": SHM_PATH,
            "present": False,
            "status": f"no {SHM_PATH} on this machine ({exc.strerror or exc})",
        }
    return {
        "path": SHM_PATH,
        "present": True,
        "total_bytes": usage.total,
        "used_bytes": usage.used,
        "free_bytes": usage.free,
        "low": usage.total < SHM_LOW_BYTES,
    }


def shm_probe_collect() -> dict[str, Any]:
    """Share a small CPU tensor the way DataLoader workers do, proving it works here and now."""
    import torch

    try:
        tensor = torch.arange(PROBE_ELEMENTS, dtype=torch.float32).share_memory_()
    except (RuntimeError, OSError) as exc:
        return {"name": "probe", "is_shared": False, "error": str(exc)}
    return {
        "name": "probe",
        "is_shared": tensor.is_shared(),
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "shape": list(tensor.shape),
        "bytes": tensor.nbytes,
    }


@functools.cache
def torch_facts_static() -> dict[str, Any]:
    """What torch was built with. torch.cuda.* is never called: it would initialise CUDA."""
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as exc:
        return {"torch": {"error": f"torch cannot be imported: {exc}"}, "sharing": {}}
    available = dist.is_available()
    backends: dict[str, bool] = {}
    for backend in DISTRIBUTED_BACKENDS:
        check = getattr(dist, f"is_{backend}_available", None)
        if check is not None:  # ucc only exists in some releases
            backends[backend] = bool(available and check())
    return {
        "torch": {
            "version": torch.__version__,
            "cuda_compiled": torch.version.cuda,
            "distributed_available": available,
            "distributed_backends": backends,
        },
        "sharing": {
            # Per process: this is what the worker, and so a child it starts, uses by default.
            "sharing_strategy": mp.get_sharing_strategy(),
            "sharing_strategies": sorted(mp.get_all_sharing_strategies()),
        },
    }


def machine_facts_collect(*, with_torch: bool = True) -> dict[str, Any]:
    """Everything a worker reports about its machine; see the module docstring for the costs.

    `with_torch=False` is for the web process, which only needs CPUs and GPUs and should not
    pay for importing torch.
    """
    memory = psutil.virtual_memory()
    facts: dict[str, Any] = {
        "hostname": machine_name(),
        "collected_at": datetime.now(UTC).isoformat(),
        "cpu_count": cpu_count_usable(),
        # Busy now: percent of all cores since this process's previous call (the reporter's
        # last report), and the load average over a minute.
        "cpu_percent": float(psutil.cpu_percent(interval=None)),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "memory": {"total_bytes": memory.total, "available_bytes": memory.available},
        **gpu_facts_collect(),
        # What a training subprocess inherits; the launcher should set PCI_BUS_ID so that the
        # GPU ids above (NVML order) mean the same GPUs to CUDA.
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    shared_memory = shm_usage_collect()
    if with_torch:
        static = torch_facts_static()
        facts["torch"] = static["torch"]
        shared_memory.update(static["sharing"])
        if "error" not in static["torch"]:
            shared_memory["shared_tensors"] = [shm_probe_collect()]
        facts.update(catalogue_facts_collect())
    facts["shared_memory"] = shared_memory
    return facts


def catalogue_facts_collect() -> dict[str, Any]:
    """What this machine can train (training/catalogue.py): its models, datasets and image
    folders. Read at every report, so a folder written since shows at the next one; a plug-in
    installed since needs a restart (the entry points are read at start by importlib).
    A failure leaves the report without them, which the dashboard reads as the built-ins."""
    from django.conf import settings

    from training.catalogue import catalogue_collect

    try:
        report = catalogue_collect(data_dir=Path(settings.TRAINYARD_DATA_DIR))
    except Exception as exc:  # a broken plug-in or folder must not silence the whole report
        logger.exception("the catalogue of models and datasets failed")
        return {"catalogue_error": f"{type(exc).__name__}: {exc}"}
    report["models_stages"] = plugin_stages_count(report)
    return report


def plugin_stages_count(report: dict[str, Any]) -> dict[str, int]:
    """The most pipeline stages each splittable plug-in model cuts into: only the workers have
    a plug-in, so they count it for the launch checks (the web server counts the built-in and
    torchvision's models itself, dashboard/experiments/core/catalogue_checks.py)."""
    sources = report.get("model_sources") or {}
    language = set(report.get("language_models") or [])
    counts = {
        name: _stages_of(name, language=name in language)
        for name in report.get("models_splittable") or []
        if str(sources.get(name, "")).startswith("plug-in")
    }
    return {name: count for name, count in counts.items() if count is not None}


@functools.cache
def _stages_of(name: str, *, language: bool) -> int | None:
    # Built once on the meta device, once a process: a plug-in changes only with a restart. A
    # language model is built for its own window (its parts do not depend on it).
    from training.catalogue import language_plugin_window
    from training.models.build import model_stage_limit

    return model_stage_limit(name, seq_len=language_plugin_window(name) if language else None)
