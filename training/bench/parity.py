"""``python -m training.bench parity``: the same training, strategy by strategy, same accuracy?

Runs ``python -m training`` once per strategy and seed (``--seeds``, default 1,2,3) with the same
dataset, epochs and GLOBAL batch (``--global-batch``, default 64): single, dp and model-parallel
take the whole global batch in one process; ddp, hogwild, deepspeed and fsdp run ``--nproc``
processes (default 2) with ``--batch-size`` global batch / nproc each; the ranks of
tensor-parallel and the stages of pipeline train on one batch together (the whole global batch;
pipeline in its default 4 micro-batches, GPipe, over as many stages as ``--nproc``: the built-in
model has 2), and fsdp-tp's pairs each on global batch / (nproc / 2), so it runs where
``--nproc`` is even and 4 or more (skipped, with why, otherwise). Each run's accuracy is the
``test_accuracy`` of its ``finished`` event.

A strategy may carry its options (``training/registry.py``) as ``name:option=value``, each such
row beside the plain one: ``single:precision=bf16`` trains under bfloat16 autocast,
``ddp:accumulate=2`` adds up 2 batches a step, each half the size (global batch / nproc / 2
images), so that the step still takes the global batch. The defaults add those two and
``ddp:precision=bf16`` to every strategy of the registry.

Per strategy the table shows the per-process batch, the processes, the accuracy for each seed,
their mean, their spread (max - min: how far seeds alone move a strategy) and the mean's
difference from single's mean. The last line, ``parity ratio``, is the smallest
mean accuracy / single's mean accuracy over the strategies that ran: 1.0 means no strategy trains
worse than one process.

Strategies this machine cannot run are shown as skipped with the reason (deepspeed where the
package is not installed, dp-primitives with fewer than 2 GPUs); a strategy whose run fails is
shown as failed with the first line of its error and left out of the ratio. Without single there
is nothing to compare with: the command then exits 1. On a machine with GPUs, dp and
dp-primitives get ``--gpus`` (they need it there); the others train on the CPU.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from training.bench.launch import training_command, training_env
from training.cli import package_available
from training.config import DATASETS
from training.protocol import parse_event
from training.registry import (
    MULTIPROCESS_STRATEGIES,
    STRATEGY_NAMES,
    OptionValue,
    StrategyOption,
    mesh_shape,
    pipeline_refusals,
    strategy_get,
    strategy_refusals,
)

# Every strategy the registry has (single first: the others are compared with it), then the
# step's options beside fp32 and one batch a step.
DEFAULT_STRATEGIES = (
    *STRATEGY_NAMES,
    "single:precision=bf16",
    "ddp:precision=bf16",
    "ddp:accumulate=2",
)


@dataclass(frozen=True)
class Variant:
    """A strategy with some of its options: ``ddp:accumulate=2``."""

    strategy: str
    options: tuple[tuple[StrategyOption, OptionValue], ...] = ()

    @property
    def label(self) -> str:
        return " ".join([self.strategy, *(f"{o.name}={v}" for o, v in self.options)])

    @property
    def accumulate(self) -> int:
        return next((int(v) for o, v in self.options if o.name == "accumulate"), 1)

    def flags(self) -> list[str]:
        return [word for option, value in self.options for word in option.cli_args(value)]


def variant_parse(text: str) -> Variant:
    """``name`` or ``name:option=value[:option=value]``; a ValueError says what is wrong."""
    name, *pairs = text.split(":")
    if name not in STRATEGY_NAMES:
        raise ValueError(f"unknown strategy {name}")
    taken = {option.name: option for option in strategy_get(name).options}
    options = []
    for pair in pairs:
        key, _, word = pair.partition("=")
        if key not in taken:
            takes = f"it takes {', '.join(taken)}" if taken else "it takes none"
            raise ValueError(f"{name} takes no option {key!r} ({takes})")
        option = taken[key]
        value = next((v for v in option.values if str(v).lower() == word.lower()), None)
        if value is None:
            raise ValueError(f"{text}: {option.invalid_text()}")
        options.append((option, value))
    return Variant(name, tuple(options))


@dataclass
class Row:
    strategy: str  # the variant's label: "ddp accumulate=2"
    batch: int  # per process (per micro-batch with accumulate)
    procs: int
    accuracies: list[float] = field(default_factory=list)
    problem: str = ""  # "skipped: ..." or "failed: ...", else empty

    @property
    def mean(self) -> float:
        return sum(self.accuracies) / len(self.accuracies)

    @property
    def spread(self) -> float:
        return max(self.accuracies) - min(self.accuracies)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.bench parity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: 1,2,3)")
    p.add_argument("--global-batch", type=int, default=64, help="images per optimizer step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument(
        "--steps-per-epoch", type=int, default=None, help="passed on (for quick smoke runs)"
    )
    p.add_argument("--dataset", choices=DATASETS, default="mnist")
    p.add_argument(
        "--nproc", type=int, default=2, help=f"processes for {', '.join(MULTIPROCESS_STRATEGIES)}"
    )
    p.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"comma-separated (default: {','.join(DEFAULT_STRATEGIES)}); single always runs",
    )
    p.add_argument(
        "--data-dir", default=os.environ.get("TRAINYARD_DATA_DIR") or "./var/data", type=Path
    )
    return p


def main(argv: list[str]) -> int:
    args, seeds, strategies = _args_parse(argv)
    gpus = _gpu_count()
    rows = [_row_run(strategy, seeds, args, gpus) for strategy in strategies]
    print(
        f"parity benchmark: {args.dataset}, {args.epochs} epoch(s)"
        + (f" of {args.steps_per_epoch} step(s)" if args.steps_per_epoch else "")
        + f", global batch {args.global_batch}, seeds {','.join(map(str, seeds))}; "
        "test accuracy of each run's finished event"
    )
    single = rows[0]
    base = None if single.problem else single.mean
    _table_print(rows, seeds, base)
    if base is None:
        print("parity ratio: n/a (single failed)")
        return 1
    ratio = min(row.mean / base for row in rows if not row.problem)
    print(f"parity ratio: {ratio:.3f}")
    return 0


def _args_parse(argv: list[str]) -> tuple[argparse.Namespace, list[int], list[Variant]]:
    """The options, the seeds and the strategies (plain single first); exits on a bad one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"argument --seeds: expected integers like 1,2,3, got {args.seeds!r}")
    try:
        strategies = [variant_parse(s.strip()) for s in args.strategies.split(",") if s.strip()]
    except ValueError as exc:
        parser.error(f"argument --strategies: {exc}")
    if not seeds:
        parser.error("argument --seeds: give at least one seed")
    if args.global_batch % args.nproc:
        parser.error(f"--global-batch {args.global_batch} does not split over --nproc {args.nproc}")
    for variant in strategies:
        procs = args.nproc if variant.strategy in MULTIPROCESS_STRATEGIES else 1
        if (args.global_batch // procs) % variant.accumulate:
            parser.error(
                f"argument --strategies: {variant.label}: {args.global_batch // procs} images "
                f"a process do not split into {variant.accumulate} batches a step"
            )
    single = Variant("single")
    return args, seeds, [single, *(v for v in strategies if v != single)]


def _row_run(variant: Variant, seeds: list[int], args: argparse.Namespace, gpus: int) -> Row:
    """``variant``'s row: one run per seed, until one fails (or skipped, with why)."""
    row, extra = _plan(variant, args, gpus)
    if row.problem:
        return row
    for seed in seeds:
        print(f"parity: {variant.label} seed {seed} ...", file=sys.stderr, flush=True)
        accuracy, error = run_one(variant.strategy, seed, row.batch, extra, args)
        if accuracy is None:
            row.problem = f"failed: {error}"
            break
        row.accuracies.append(accuracy)
    return row


def _table_print(rows: list[Row], seeds: list[int], base: float | None) -> None:
    seed_cols = " ".join(f"{'seed ' + str(s):>8}" for s in seeds)
    print(
        f"{'strategy':<24} {'batch/proc':>10} {'procs':>5} {seed_cols} {'mean':>8} "
        f"{'spread':>8} {'vs single':>9}"
    )
    for row in rows:
        head = f"{row.strategy:<24} {row.batch:>10} {row.procs:>5}"
        if row.problem:
            print(f"{head} {row.problem}")
            continue
        accs = " ".join(f"{a:8.4f}" for a in row.accuracies)
        diff = f"{row.mean - base:+9.4f}" if base is not None else f"{'n/a':>9}"
        print(f"{head} {accs} {row.mean:8.4f} {row.spread:8.4f} {diff}")


def _plan(variant: Variant, args: argparse.Namespace, gpus: int) -> tuple[Row, list[str]]:
    """The row for ``variant`` (batch, processes; skipped with why) and its extra flags."""
    strategy, accumulate = variant.strategy, variant.accumulate
    if strategy in MULTIPROCESS_STRATEGIES:
        # Ranks that split the model share a batch: the global batch is split over the rest.
        slices, _ = mesh_shape(strategy, args.nproc)
        row = Row(variant.label, args.global_batch // slices // accumulate, args.nproc)
        extra = ["--nproc", str(args.nproc)]
        mesh = [r.cli_message for r in strategy_refusals(strategy, processes=args.nproc, gpus=[])]
        mesh += [
            r.cli_message
            for r in pipeline_refusals(
                strategy, processes=args.nproc, batch_size=row.batch,
                microbatches=None, schedule=None,
            )
        ]  # fmt: skip
        if mesh:
            row.problem = f"skipped: {mesh[0]}"
    else:
        row, extra = Row(variant.label, args.global_batch // accumulate, 1), []
    spec = strategy_get(strategy)
    if spec.requires is not None and not package_available(spec.requires.module):
        row.problem = f"skipped: the {spec.requires.module} package is not installed"
    if spec.min_gpus:
        if gpus < spec.min_gpus:
            row.problem = f"skipped: needs {spec.min_gpus} or more GPUs, this machine has {gpus}"
        else:
            extra = ["--gpus", ",".join(map(str, range(spec.min_gpus)))]
    if spec.gpus_where_present and gpus:
        extra = ["--gpus", ",".join(map(str, range(min(gpus, 2))))]
    return row, [*extra, *variant.flags()]


def run_one(
    strategy: str, seed: int, batch: int, extra: list[str], args: argparse.Namespace
) -> tuple[float | None, str]:
    """(test accuracy, "") for a finished run, else (None, the first line of its error)."""
    flags = [*extra, "--dataset", args.dataset]
    flags += ["--data-dir", str(args.data_dir.expanduser().resolve())]
    flags += ["--batch-size", str(batch), "--epochs", str(args.epochs), "--seed", str(seed)]
    flags += ["--run-id", "parity"]
    if args.steps_per_epoch:
        flags += ["--steps-per-epoch", str(args.steps_per_epoch)]
    cmd = training_command(strategy, flags)
    env = training_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    events = [e for e in map(parse_event, proc.stdout.splitlines()) if e is not None]
    finished = [e for e in events if e["type"] == "finished"]
    if proc.returncode == 0 and finished:
        return float(finished[-1]["test_accuracy"]), ""
    failed = [e for e in events if e["type"] == "failed"]
    if failed and str(failed[-1].get("error", "")).strip():
        return None, str(failed[-1]["error"]).strip().splitlines()[0]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return None, lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
