"""``python -m training.bench phases``: what timing each rank's phases costs (issue 19: a run
with the breakdown on keeps at least 0.98 of its images/s).

The same short training (``python -m training``, ``--steps`` steps of one epoch, one step event
every ``--steps // 4``) runs with the phase clock (the default) and without it (``--no-phases``:
no phase timed, no collective wrapped, DDP's C++ all-reduce instead of the timed Python hook),
side by side: each round runs both, back to back, in alternating order, so that the machine's
noise falls on both alike. A run's images/s is the median of its step events' after the first
(the first window holds the warm-up). Per strategy (``--strategies``, default single and ddp
over 2 ranks) the table shows the median images/s with and without over ``--rounds`` rounds,
the median of the rounds' ratios (with / without) and their range, the machine's noise. The last
line, ``phases ratio``, is the smallest of the medians: 1.0 means the breakdown costs nothing.
Above it, what the clock measured: each rank's share of its wall time per phase and the bytes it
sent a step, over the clocked runs' step events after the first, all rounds together (the run
page's breakdown, for a training run alone).

``--dry-run``: one round of a few steps, to check that the benchmark runs (no figure to trust).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from collections.abc import Sequence

from training.bench.launch import training_command, training_env
from training.catalogue import MODEL_DEFAULT
from training.observe.phases import PHASES
from training.protocol import parse_event

DEFAULT_STRATEGIES = ("single", "ddp")
WINDOWS = 4  # step events a run reports
SIDES = ("with", "without")
BREAKDOWN_HEADER = "where each rank's wall time went, with the clock"


class Run:
    """One training's figures: images/s per step event, and each rank's phase seconds and bytes
    sent summed over its step events but the first (the warm-up's)."""

    def __init__(self, events: list[dict]) -> None:
        steps = [e for e in events if e and e["type"] == "step"]
        if not steps:
            raise RuntimeError("no step reported")
        self.figures = [e["images_per_second"] for e in steps]
        self.seconds: dict[int, dict[str, float]] = {}
        self.bytes: dict[int, int] = {}
        self.steps = steps[-1]["step"] - steps[0]["step"]
        for event in steps[1:]:
            for rank in event.get("ranks", []):
                if "forward_seconds" not in rank:
                    continue  # --no-phases, or a strategy the clock does not see
                mine = self.seconds.setdefault(rank["rank"], dict.fromkeys(PHASES, 0.0))
                for phase in PHASES:
                    mine[phase] += rank[f"{phase}_seconds"]
                sent = rank.get("communication_bytes", 0)
                self.bytes[rank["rank"]] = self.bytes.get(rank["rank"], 0) + sent

    def images_per_second(self) -> float:
        return statistics.median(self.figures[1:] or self.figures)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.bench phases", description=__doc__)
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--rounds", type=int, default=3, help="runs of each side (default: 3)")
    p.add_argument("--steps", type=int, default=200, help="steps a run (default: 200)")
    p.add_argument("--nproc", type=int, default=2, help="ranks of a multi-process strategy")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--model", default=MODEL_DEFAULT)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--dry-run", action="store_true", help="one round of 8 steps: does it run")
    return p


def run_training(strategy: str, *, phases: bool, args: argparse.Namespace) -> Run:
    """One training, as ``python -m training`` runs it alone."""
    flags = [
        "--nproc", str(args.nproc), "--epochs", "1", "--steps-per-epoch", str(args.steps),
        "--log-interval", str(max(args.steps // WINDOWS, 1)), "--batch-size",
        str(args.batch_size), "--model", args.model, "--dataset", args.dataset,
        "--test-batch-size", "1000", *([] if phases else ["--no-phases"]),
    ]  # fmt: skip
    proc = subprocess.run(
        training_command(strategy, flags), env=training_env(), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{strategy} failed: {proc.stderr.strip()[-2000:]}")
    try:
        return Run([dict(e) for e in map(parse_event, proc.stdout.splitlines()) if e])
    except RuntimeError as exc:
        raise RuntimeError(f"{strategy}: {exc}") from None


def strategy_measure(strategy: str, args: argparse.Namespace) -> dict[str, list[Run]]:
    """Each side's runs, one a round, both sides back to back, order alternating."""
    found: dict[str, list[Run]] = {side: [] for side in SIDES}
    for round_ in range(args.rounds):
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            found[side].append(run_training(strategy, phases=side == "with", args=args))
    return found


def breakdown_rows(strategy: str, runs: list[Run]) -> list[str]:
    """Per rank: each phase's share of the summed wall time, and bytes sent a step."""
    seconds: dict[int, dict[str, float]] = {}
    sent: dict[int, int] = {}
    steps = sum(run.steps for run in runs)
    for run in runs:
        for rank, mine in run.seconds.items():
            total = seconds.setdefault(rank, dict.fromkeys(PHASES, 0.0))
            for phase in PHASES:
                total[phase] += mine[phase]
            sent[rank] = sent.get(rank, 0) + run.bytes.get(rank, 0)
    rows = []
    for rank in sorted(seconds):
        wall = sum(seconds[rank].values()) or 1.0
        shares = " ".join(f"{100 * seconds[rank][p] / wall:>{max(len(p), 5)}.1f}" for p in PHASES)
        rows.append(f"{strategy:10} {rank:>4} {shares} {sent[rank] // max(steps, 1):>12}")
    return rows


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.dry_run:
        args.rounds, args.steps = 1, 8
    header = f"{'strategy':10} {'with':>10} {'without':>10} {'ratio':>7} {'rounds':>13}"
    print(f"{header}   (images/s, medians of {args.rounds} rounds; the rounds' ratios)")
    ratios, breakdown = [], []
    for strategy in args.strategies.split(","):
        found = strategy_measure(strategy, args)
        speeds = {side: [run.images_per_second() for run in found[side]] for side in SIDES}
        rounds = [w / o for w, o in zip(speeds["with"], speeds["without"], strict=True)]
        ratios.append(statistics.median(rounds))
        breakdown += breakdown_rows(strategy, found["with"])
        with_, without = (statistics.median(speeds[side]) for side in SIDES)
        spread = f"{min(rounds):.3f}-{max(rounds):.3f}"
        row = f"{strategy:10} {with_:10.1f} {without:10.1f} {ratios[-1]:7.3f} {spread:>13}"
        print(row, flush=True)
    print(f"{BREAKDOWN_HEADER} (% of each rank's wall time; bytes it sent a step)")
    names = " ".join(f"{p:>5}" for p in PHASES)
    print(f"{'strategy':10} {'rank':>4} {names} {'bytes/step':>12}")
    for row in breakdown:  # none where no run reported phases (a one-step run)
        print(row)
    print(f"phases ratio: {min(ratios):.3f}")
    return 0
