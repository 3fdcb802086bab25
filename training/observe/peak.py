"""The peak that a language model's MFU is measured against: what the run's devices could do.

MFU (model FLOPs utilisation) = tokens per second x FLOPs per token (the model's estimate,
``training.models.byte_llama.model.flops_per_token``) / the peak FLOP/s of the run's devices.

- A GPU of the table below: its dense peak in the run's compute precision (NVIDIA's datasheets;
  fp32 is the non-tensor-core figure, as torch multiplies float32 without TF32 by default).
- A CPU, or a GPU not in the table: a peak measured once per machine by a short matrix-multiply
  calibration (``MATMUL_SIZE`` square, best of ``ROUNDS`` rounds of about ``ROUND_SECONDS``,
  every core the process may use), cached in ``$XDG_CACHE_HOME/trainyard/peak-flops.json`` by
  machine, processor, core count, dtype and torch version; said as "measured peak" beside the
  figure. ``$TRAINYARD_PEAK_FLOPS`` (FLOP/s of one device or machine) skips it.

On the CPU the run's devices are the threads its ranks compute with on a machine (each rank's
torch threads, torchrun's one by default, times the ranks there; at most the cores the process
may use), not every core: a run of 2 ranks on a 16-core worker holds 2 of them, the others
being other runs' (the dashboard's allocation), and its MFU is against the machine's peak x
2 / 16 (a peak counts per core; one calibration a machine serves every run on it).

Rank 0 measures (the cache is per machine) while the other ranks wait in a collective, so no
rank's work competes with it; the run's peak is that machine's (or device's) times the machines
(or GPU ranks) of the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from training.process.runtime import Runtime, all_gather

PEAK_ENV = "TRAINYARD_PEAK_FLOPS"
MATMUL_SIZE = 1024
ROUNDS = 5
ROUND_SECONDS = 0.2
# Dense peaks (FLOP/s) by the model's word in torch.cuda.get_device_name, per compute dtype.
GPU_PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.5e12, "fp16": 989.5e12, "fp32": 66.9e12},
    "H100": {"bf16": 989.5e12, "fp16": 989.5e12, "fp32": 66.9e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12},
    "L4": {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    """The run's peak: ``flops`` per second over all its devices, and how it was found."""

    flops: float
    source: str  # for people: "measured peak, ..." or the table's device

    def mfu(self, tokens_per_second: float, flops_per_token: int) -> float:
        return round(tokens_per_second * flops_per_token / self.flops, 5)


def run_peak(rt: Runtime, precision: str, machines: Sequence[str]) -> Peak:
    """The run's peak (every rank calls this: rank 0 finds it, the others wait and learn it)."""
    found = _machine_share(rt, precision, machines) if rt.is_main else None
    flops, source = all_gather(rt, found)[0]
    if rt.device.type == "cuda":
        return Peak(flops * rt.world_size, f"{source}, x {rt.world_size} GPU(s)")
    count = len(set(machines)) or 1
    return Peak(flops * count, f"{source}" + (f", x {count} machines" if count > 1 else ""))


def _machine_share(rt: Runtime, precision: str, machines: Sequence[str]) -> tuple[float, str]:
    """One GPU's peak, or on the CPU the machine's x the share of its cores the run computes
    with there (``run_threads``), as a peak is counted: per core."""
    flops, source = device_peak(rt.device, precision)
    if rt.device.type != "cpu":
        return flops, source
    cores = _cores()
    used = max(1, min(run_threads(machines), cores))
    if used == cores:
        return flops, source
    return flops * used / cores, f"{source}; the run's {used} of its {cores} cores"


def run_threads(machines: Sequence[str]) -> int:
    """The threads the run computes with on rank 0's machine: its ranks there (``machines``:
    each rank's) times this rank's torch threads."""
    local = sum(1 for machine in machines if machine == machines[0]) if machines else 1
    return local * torch.get_num_threads()


def _cores() -> int:
    """The cores this process may use."""
    found = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return found or 1


def device_peak(device: torch.device, precision: str) -> tuple[float, str]:
    """(FLOP/s, how found) of one GPU, or of this machine's CPU cores."""
    given = os.environ.get(PEAK_ENV, "").strip()
    if given:
        return float(given), f"${PEAK_ENV}"
    dtype = precision if precision in DTYPES else "fp32"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peaks in GPU_PEAKS.items():
            # The model as a word of the name: "L4" is in "NVIDIA L40", "A10" in "A10G".
            if re.search(rf"(?<![A-Za-z0-9]){key}(?![A-Za-z0-9])", name):
                return peaks[dtype], f"{name}'s datasheet peak ({dtype}, dense)"
    return _measured(device, dtype)


def _measured(device: torch.device, dtype: str) -> tuple[float, str]:
    cores = _cores()
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else _processor()
    key = f"{platform.node()}|{what}|{cores} cores|{dtype}|torch {torch.__version__}"
    cache = _cache_path()
    known = _cache_read(cache)
    if key not in known:
        known[key] = calibrate(device, DTYPES[dtype], threads=cores)
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(known, indent=1))
    where = f"{cores} cores" if device.type == "cpu" else what
    return known[key], f"measured peak ({where}, {dtype} matmul {MATMUL_SIZE}x{MATMUL_SIZE})"


def calibrate(device: torch.device, dtype: torch.dtype, *, threads: int) -> float:
    """FLOP/s of a square matmul on ``device``: the best round of ``ROUNDS``, with ``threads``
    threads on the CPU (every core, whatever this rank's own share is)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(dtype)
        b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device).to(dtype)
        best = 0.0
        for _ in range(ROUNDS):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < ROUND_SECONDS:
                torch.mm(a, b)
                count += 1
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            best = max(best, 2 * MATMUL_SIZE**3 * count / (time.perf_counter() - start))
        return best
    finally:
        torch.set_num_threads(before)


def _processor() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainyard" / "peak-flops.json"


def _cache_read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
