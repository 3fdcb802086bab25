"""The peak a language model's MFU is measured against, on the CPU: the machine's (one
calibration on every core, cached) x the share of its cores the run computes with there (its
ranks there x each rank's torch threads), not every core of the machine, whose other cores the
dashboard gives other runs. The matmul calibration itself is replaced by one that says what it
was asked (1 GFLOP/s a thread); its cache goes to the test's folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from training.observe import peak
from training.process.runtime import Runtime

CPU = torch.device("cpu")


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[int]]:
    """The thread counts the calibration was run with, on a machine of 8 cores."""
    found: list[int] = []

    def calibrate(device: torch.device, dtype: torch.dtype, *, threads: int) -> float:
        found.append(threads)
        return 1e9 * threads

    monkeypatch.setattr(peak, "calibrate", calibrate)
    monkeypatch.setattr(peak.os, "sched_getaffinity", lambda _pid: set(range(8)), raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(peak.PEAK_ENV, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's OMP_NUM_THREADS=1 holds each rank
    yield found
    torch.set_num_threads(before)


def runtime(world: int) -> Runtime:
    """Rank 0 of ``world`` (not distributed: the gathers return its own value)."""
    return Runtime(0, 0, world, CPU, "cpu", distributed=False)


def test_one_process_of_one_thread_has_one_cores_share(asked: list[int]) -> None:
    found = peak.run_peak(runtime(1), "fp32", ["host-a"])
    assert asked == [8]  # the machine's peak, every core
    assert found.flops == 1e9
    assert found.source.startswith("measured peak (8 cores, fp32")
    assert found.source.endswith("; the run's 1 of its 8 cores")


def test_ranks_on_a_machine_add_their_threads_and_machines_multiply(asked: list[int]) -> None:
    two = peak.run_peak(runtime(2), "fp32", ["host-a", "host-a"])
    assert asked == [8] and two.flops == 2e9
    # Two machines of 2 ranks: each machine's 2 threads (measured once: cached), x 2 machines.
    four = peak.run_peak(runtime(4), "fp32", ["host-a", "host-a", "host-b", "host-b"])
    assert asked == [8] and four.flops == 4e9
    assert four.source.endswith(", x 2 machines")


def test_no_more_threads_than_the_cores_the_process_may_use(asked: list[int]) -> None:
    torch.set_num_threads(4)
    found = peak.run_peak(runtime(4), "fp32", ["host-a"] * 4)  # 16 threads asked of 8 cores
    assert asked == [8] and found.flops == 8e9
    assert found.source.startswith("measured peak (8 cores, fp32")


def test_a_peak_given_for_the_machine_is_shared_as_a_measured_one(
    asked: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(peak.PEAK_ENV, "8e9")  # the machine's, all 8 cores
    found = peak.run_peak(runtime(2), "fp32", ["host-a", "host-a"])
    assert asked == [] and found.flops == 2e9
    assert found.source == f"${peak.PEAK_ENV}; the run's 2 of its 8 cores"


@pytest.mark.parametrize(
    ("name", "found"),
    [
        ("NVIDIA H100 80GB HBM3", "datasheet"),
        ("NVIDIA A100-SXM4-40GB", "datasheet"),
        ("NVIDIA L4", "datasheet"),
        ("NVIDIA L40S", "datasheet"),
        # Not in the table: measured, not another card's peak ("L4" is in "L40", "A10" in "A10G").
        ("NVIDIA L40", "measured"),
        ("NVIDIA A10G", "measured"),
    ],
)
def test_a_gpu_takes_its_own_datasheet_peak_or_none(
    asked: list[int], monkeypatch: pytest.MonkeyPatch, name: str, found: str
) -> None:
    monkeypatch.setattr(peak.torch.cuda, "get_device_name", lambda _device=None: name)
    flops, source = peak.device_peak(torch.device("cuda", 0), "bf16")
    if found == "datasheet":
        key = name.split()[1].split("-")[0]
        assert (flops, source) == (
            peak.GPU_PEAKS[key]["bf16"],
            f"{name}'s datasheet peak (bf16, dense)",
        )
    else:
        assert source.startswith(f"measured peak ({name}") and asked == [8]
