"""``python -m training.bench script``: what Trainyard costs a user's script (issue 32: under
Trainyard a script keeps at least 0.98 of its images/s under bare torchrun).

One script (scripts/ddp_images.py: DDP over Gloo on 2 ranks, a small CNN on Fashion-MNIST,
`run.log` of five figures and `should_stop()` every step) runs two ways, side by side: under bare
`torchrun --standalone` (the library is then a quiet run that still makes its collectives, so
the script behaves the same) and as a script run (`python -m training --strategy script`: the
launcher, each rank's output through torchrun's tee, the events written and read and passed on).
Each round runs both, back to back, in alternating order, so that the machine's noise falls on
both alike; each run prints its images/s over the steps after the warm-up. The table shows the
median of each side over ``--rounds`` rounds and the rounds' ratios; the last line, ``script
ratio``, is the median ratio (Trainyard / bare): 1.0 means Trainyard costs nothing.

``--dry-run``: one round of a few steps, to check that the benchmark runs (no figure to trust).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_images.py"
ROOT = Path(__file__).resolve().parents[2]
SIDES = ("trainyard", "bare")
FIGURE = re.compile(r"images/s ([0-9.]+)")


def command(side: str, *, nproc: int, script_args: list[str], folder: Path) -> list[str]:
    if side == "bare":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", str(SCRIPT), *script_args]  # fmt: skip
    return [sys.executable, "-m", "training", "--strategy", "script", "--nproc", str(nproc),
            "--code-dir", str(SCRIPT.parent), "--entrypoint", SCRIPT.name,
            "--checkpoint-dir", str(folder), "--", *script_args]  # fmt: skip


def images_per_second(side: str, *, nproc: int, script_args: list[str], folder: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = command(side, nproc=nproc, script_args=script_args, folder=folder)
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    found = FIGURE.search(done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{side} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return float(found[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench script")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="one round of a few steps")
    args = parser.parse_args(argv)
    rounds, steps = (1, 6) if args.dry_run else (args.rounds, args.steps)
    script_args = ["--steps", str(steps), "--warmup", str(max(1, steps // 6))]
    figures: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(rounds):
            for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
                measured = images_per_second(side, nproc=args.nproc, script_args=script_args,
                                             folder=Path(folder))  # fmt: skip
                figures[side].append(measured)
                print(f"round {round_ + 1} {side:9} {measured:10.1f} images/s", flush=True)
    ratios = [t / b for t, b in zip(figures["trainyard"], figures["bare"], strict=True)]
    print(f"{'side':9} {'median images/s':>16}")
    for side in SIDES:
        print(f"{side:9} {statistics.median(figures[side]):16.1f}")
    print(f"ratios per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    print(f"script ratio: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
