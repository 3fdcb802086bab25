"""``python -m training.bench observe``: what the in-rank observer costs a user's script (issue
33: observed, a script keeps at least 0.98 of its images/s).

The script (tests/scripts/observed/train.py: a small CNN on Fashion-MNIST through a DataLoader,
2 Gloo ranks, no Trainyard line in it) runs wrapped in DDP and sharded by FSDP2, each two ways
side by side: bare (``torchrun train.py``) and observed (``torchrun -m training.scripts.rank --
train.py``, TRAINYARD_OBSERVE=1 and an events folder, so that rank 0's window events are written
as in a script run). Each round runs both sides of each script back to back, in alternating
order, so that the machine's noise falls on both alike; the script prints its images/s over the
steps after its warm-up. Per script the table shows each side's median over ``--rounds`` rounds
and the rounds' ratios (observed / bare), then ``observe ratio <script>:``, their median; the
last line, ``observe ratio:``, is the smaller of the two: 1.0 means the observer costs nothing.

An observed run whose observer wrote no step event, or said it stopped, fails the benchmark: it
would measure an unobserved script.

``--dry-run``: one round of a few steps, to check that the benchmark runs (no figure to trust).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from training.scripts.observer import OBSERVER_FILE

ROOT = Path(__file__).resolve().parents[2]
# The script and the data module it imports from beside it, copied into one folder as a user's.
CODE = (ROOT / "tests/scripts/observed/train.py", ROOT / "tests/scripts/fashion.py")
WRAPS = ("ddp", "fsdp")
SIDES = ("observed", "bare")
NPROC = 2
FIGURE = re.compile(r"images/s ([0-9.]+)")
# The script's own data folder (tests/scripts/fashion.py), not a setting of Trainyard's.
KEPT = {"TRAINYARD_FASHION_DIR"}
TEARDOWN = "terminate called without an active exception"


def environment() -> dict[str, str]:
    """This process's environment without Trainyard's settings (a developer's shell may hold
    some), the repository importable: the same for both sides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_") or k in KEPT}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def command(side: str, script_args: list[str]) -> list[str]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={NPROC}"]  # fmt: skip
    if side == "bare":
        return [*torchrun, "train.py", *script_args]
    return [*torchrun, "-m", "training.scripts.rank", "--", "train.py", *script_args]


def images_per_second(side: str, script_args: list[str], code: Path) -> float:
    env = environment()
    with tempfile.TemporaryDirectory() as events:
        if side == "observed":
            env |= {"TRAINYARD_OBSERVE": "1", "TRAINYARD_EVENTS_DIR": events}
        argv = command(side, script_args)
        done = subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True, check=False)
        found = FIGURE.search(done.stdout)
        # A rank aborting in Gloo's teardown now and then, after the figure (on either side;
        # dashboard/experiments/runs/outcome.py): the figure stands.
        ended = done.returncode == 0 or TEARDOWN in done.stderr
        if not ended or found is None:
            raise RuntimeError(f"{side} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        if side == "observed":
            written = Path(events) / OBSERVER_FILE.format(rank=0)
            windows = len(written.read_text().splitlines()) if written.is_file() else 0
            if windows == 0 or "observer stopped" in done.stderr:
                raise RuntimeError(f"an unobserved run: {windows} events in {written.name}, "
                                   f"or its observer stopped:\n{done.stderr[-3000:]}")  # fmt: skip
    return float(found[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench observe")
    parser.add_argument("--rounds", type=int, default=5)
    # 90,000 images a run: DDP some 11 s at ~8,000 images/s on 2 cores, FSDP2 about three times
    # that; past each run's ~6 s of start (torchrun, imports, the data) that the figure leaves out.
    parser.add_argument("--images", type=int, default=30_000, help="of Fashion-MNIST's 60,000")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20, help="steps before images/s is measured")
    parser.add_argument("--dry-run", action="store_true", help="one round of a few steps")
    args = parser.parse_args(argv)
    rounds, images, epochs, warmup = (
        (1, 512, 1, 2) if args.dry_run else (args.rounds, args.images, args.epochs, args.warmup)
    )
    figures: dict[tuple[str, str], list[float]] = {(w, s): [] for w in WRAPS for s in SIDES}
    with tempfile.TemporaryDirectory() as folder:
        for path in CODE:
            shutil.copy(path, folder)
        for round_ in range(rounds):
            for wrap in WRAPS:
                script_args = ["--wrap", wrap, "--images", str(images), "--epochs", str(epochs),
                               "--warmup", str(warmup)]  # fmt: skip
                for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                    measured = images_per_second(side, script_args, Path(folder))
                    figures[wrap, side].append(measured)
                    print(f"round {round_ + 1} {wrap:4} {side:8} {measured:10.1f} images/s",
                          flush=True)  # fmt: skip
    print(f"{'script':6} {'side':8} {'median images/s':>16}")
    ratios = {}
    for wrap in WRAPS:
        for side in SIDES:
            print(f"{wrap:6} {side:8} {statistics.median(figures[wrap, side]):16.1f}")
        pairs = zip(figures[wrap, "observed"], figures[wrap, "bare"], strict=True)
        per_round = [observed / bare for observed, bare in pairs]
        print(f"ratios per round {wrap}: {', '.join(f'{r:.3f}' for r in per_round)}")
        ratios[wrap] = statistics.median(per_round)
    for wrap in WRAPS:
        print(f"observe ratio {wrap}: {ratios[wrap]:.3f}")
    print(f"observe ratio: {min(ratios.values()):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
