"""Where this process runs: rank, world size, device, and the process group for DDP."""

from __future__ import annotations

import gc
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from training.config import TrainConfig
from training.registry import TORCHRUN_STRATEGIES

log = logging.getLogger(__name__)

# A dead or stuck rank should fail the run in minutes, not after gloo's 30-minute default.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)


@dataclass(frozen=True)
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    device_label: str  # as the user named it: "cpu" or "cuda:<id from --gpus>"
    distributed: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def start(cfg: TrainConfig) -> Runtime:
    """Choose the device and, under torchrun, join the process group (undo with ``stop``)."""
    if cfg.strategy not in TORCHRUN_STRATEGIES:
        device = _local_device(cfg.gpus[0] if cfg.gpus else None)
        label = f"cuda:{cfg.gpus[0]}" if cfg.gpus else "cpu"
        return Runtime(0, 0, 1, device, label, distributed=False)

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if cfg.gpus:
        if local_rank >= len(cfg.gpus):
            raise RuntimeError(f"local rank {local_rank} has no GPU: --gpus lists {len(cfg.gpus)}")
        gpu = cfg.gpus[local_rank]
        # The launcher narrows CUDA_VISIBLE_DEVICES to --gpus, which renumbers them from 0.
        remapped = os.environ.get("CUDA_VISIBLE_DEVICES") == ",".join(map(str, cfg.gpus))
        device = _local_device(local_rank if remapped else gpu)
        torch.cuda.set_device(device)
        label, backend = f"cuda:{gpu}", "nccl"
    else:
        device, label, backend = torch.device("cpu"), "cpu", "gloo"
        _default_gloo_interface()
    dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    return Runtime(rank, local_rank, world_size, device, label, distributed=True)


def finish(rt: Runtime) -> None:
    """After a run that ended well on this rank: wait for every rank before the process group
    goes. A rank that tore Gloo down while another still had a collective of DeepSpeed's in
    flight aborted at exit ("terminate called without an active exception") now and then.
    Not on the failure path: there the other ranks may never come."""
    if rt.distributed and dist.is_initialized():
        dist.barrier()


def stop(rt: Runtime | None) -> None:
    if rt is not None and rt.distributed and dist.is_initialized():
        # DDP's reducers in reference cycles go first, their threads with them, while the
        # interpreter runs (trainyard.launched.entry_run says why).
        gc.collect()
        dist.destroy_process_group()


def all_reduce_sum(rt: Runtime, values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, so image and sample counts stay exact)."""
    if not rt.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.tolist()]


def all_gather(rt: Runtime, value: Any) -> list[Any]:
    if not rt.distributed:
        return [value]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, value)
    return out


def all_gather_floats(rt: Runtime, values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (same length on all), rank order; one small collective."""
    if not rt.distributed:
        return [list(values)]
    return floats_gather(values, world_size=rt.world_size, device=rt.device)


def floats_gather(
    values: list[float],
    *,
    world_size: int,
    device: torch.device | None = None,
    group: Any = None,
    gather: Any = None,
) -> list[list[float]]:
    """Every rank's ``values`` over ``group`` (default: every rank), rank order, by ``gather``
    (default: ``dist.all_gather`` as looked up now; a script's observer passes the one before the
    collectives were timed, so that its own is not counted as the script's)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(world_size)]
    (gather or dist.all_gather)(out, t, group=group)
    return [[float(v) for v in o.tolist()] for o in out]


def machine_name() -> str:
    """This rank's machine as the dashboard names it: its worker's name, else the host name
    (machines that share a host name, as network namespaces do, are told apart by the former)."""
    return os.environ.get("TRAINYARD_WORKER_NAME") or socket.gethostname()


def _local_device(index: int | None) -> torch.device:
    if index is None:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(f"GPU {index} was requested but CUDA is not available here")
    if index >= torch.cuda.device_count():
        raise RuntimeError(
            f"GPU {index} was requested but only {torch.cuda.device_count()} GPU(s) are visible"
        )
    return torch.device("cuda", index)


def _default_gloo_interface() -> None:
    """Point gloo at the loopback interface when the host name is not usable.

    Gloo binds to the address the host name resolves to; in containers that name is often
    missing from /etc/hosts or resolves to an address no interface has, and gloo then fails.
    Where it works (the usual case) the setting is left alone.
    """
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    try:
        address = socket.gethostbyname(socket.gethostname())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError as exc:
        log.info("host name not usable by gloo (%s); using GLOO_SOCKET_IFNAME=lo", exc)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
