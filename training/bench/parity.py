"""``python -m training.bench parity``: the same training, strategy by strategy, same accuracy?

Runs ``python -m training`` once per strategy and seed (``--seeds``, default 1,2,3) with the same
dataset, epochs and GLOBAL batch (``--global-batch``, default 64): single, dp and model-parallel
take the whole global batch in one process; ddp, hogwild, deepspeed and fsdp run ``--nproc``
processes (default 2) with ``--batch-size`` global batch / nproc each; the ranks of
tensor-parallel train on one batch together (the whole global batch), and fsdp-tp's pairs
each on global batch / (nproc / 2), so it runs where ``--nproc`` is even and 4 or more (skipped,
with why, otherwise). Each run's accuracy is the
``test_accuracy`` of its ``finished`` event.

Options run beside their strategy's plain row (``VARIANTS``): ``ddp+fp16`` and ``ddp+powersgd``
(``--comm-hook``), ``ddp+shard-optimizer`` (``--shard-optimizer``); give them in ``--strategies``
like strategies (their strategy then runs too). After the table, one line per such row gives
its mean accuracy's difference from its strategy's: what the option costs in accuracy.

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
    COMM_HOOK,
    MULTIPROCESS_STRATEGIES,
    SHARD_OPTIMIZER,
    STRATEGY_NAMES,
    SWITCH,
    OptionValue,
    StrategyOption,
    mesh_shape,
    option_refusals,
    strategy_get,
    strategy_refusals,
)


@dataclass(frozen=True)
class Variant:
    """A strategy run with one of its options set, a row beside the strategy's plain one."""

    strategy: str
    option: StrategyOption
    value: OptionValue

    @property
    def name(self) -> str:
        """ "ddp+fp16", "ddp+shard-optimizer": the row's name and its word in --strategies."""
        word = self.option.flag.removeprefix("--") if self.option.kind == SWITCH else self.value
        return f"{self.strategy}+{word}"


# The options whose accuracy is measured (bf16's hook needs NCCL, and this trains on the CPU).
VARIANTS = (
    Variant("ddp", COMM_HOOK, "fp16"),
    Variant("ddp", COMM_HOOK, "powersgd"),
    Variant("ddp", SHARD_OPTIMIZER, True),
)
VARIANT_NAMES = {variant.name: variant for variant in VARIANTS}
# Every strategy the registry has (single first: the others are compared with it), each
# followed by its variants.
DEFAULT_STRATEGIES = tuple(
    name
    for strategy in STRATEGY_NAMES
    for name in (strategy, *(v.name for v in VARIANTS if v.strategy == strategy))
)
ROW_NAME_WIDTH = max(len(name) for name in DEFAULT_STRATEGIES)


@dataclass
class Row:
    strategy: str
    batch: int  # per process
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
    for line in variant_lines(rows):
        print(line)
    if base is None:
        print("parity ratio: n/a (single failed)")
        return 1
    ratio = min(row.mean / base for row in rows if not row.problem)
    print(f"parity ratio: {ratio:.3f}")
    return 0


def _args_parse(argv: list[str]) -> tuple[argparse.Namespace, list[int], list[str]]:
    """The options, the seeds and the strategies (single first); exits on a bad one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"argument --seeds: expected integers like 1,2,3, got {args.seeds!r}")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGY_NAMES and s not in VARIANT_NAMES]
    if unknown:
        parser.error(f"argument --strategies: unknown {','.join(unknown)}")
    if not seeds:
        parser.error("argument --seeds: give at least one seed")
    if args.global_batch % args.nproc:
        parser.error(f"--global-batch {args.global_batch} does not split over --nproc {args.nproc}")
    # A variant's strategy runs too, before it: its row is what the variant is compared with.
    ordered = ["single"]
    for name in strategies:
        ordered += [VARIANT_NAMES[name].strategy if name in VARIANT_NAMES else name, name]
    return args, seeds, list(dict.fromkeys(ordered))


def _row_run(name: str, seeds: list[int], args: argparse.Namespace, gpus: int) -> Row:
    """The row of ``name``, a strategy or a variant: one run per seed, until one fails (or
    skipped, with why)."""
    variant = VARIANT_NAMES.get(name)
    strategy = variant.strategy if variant else name
    row, extra = _plan(strategy, args, gpus)
    if variant is not None:
        row.strategy = name
        extra += variant.option.cli_args(variant.value)
        # The CPU's rules (gpus=[]): ddp trains on the CPU here.
        refused = option_refusals(strategy, values={variant.option.name: variant.value}, gpus=[])
        if refused and not row.problem:
            row.problem = f"skipped: {refused[0][1]}"
    if row.problem:
        return row
    for seed in seeds:
        print(f"parity: {name} seed {seed} ...", file=sys.stderr, flush=True)
        accuracy, error = run_one(strategy, seed, row.batch, extra, args)
        if accuracy is None:
            row.problem = f"failed: {error}"
            break
        row.accuracies.append(accuracy)
    return row


def _table_print(rows: list[Row], seeds: list[int], base: float | None) -> None:
    seed_cols = " ".join(f"{'seed ' + str(s):>8}" for s in seeds)
    print(
        f"{'strategy':<{ROW_NAME_WIDTH}} {'batch/proc':>10} {'procs':>5} {seed_cols} {'mean':>8} "
        f"{'spread':>8} {'vs single':>9}"
    )
    for row in rows:
        head = f"{row.strategy:<{ROW_NAME_WIDTH}} {row.batch:>10} {row.procs:>5}"
        if row.problem:
            print(f"{head} {row.problem}")
            continue
        accs = " ".join(f"{a:8.4f}" for a in row.accuracies)
        diff = f"{row.mean - base:+9.4f}" if base is not None else f"{'n/a':>9}"
        print(f"{head} {accs} {row.mean:8.4f} {row.spread:8.4f} {diff}")


def variant_lines(rows: list[Row]) -> list[str]:
    """ "ddp+fp16 vs ddp: -0.0031 mean accuracy", one per variant's row."""
    plain = {row.strategy: row for row in rows}
    lines = []
    for row in rows:
        variant = VARIANT_NAMES.get(row.strategy)
        if variant is None:
            continue
        base = plain[variant.strategy]
        diff = "n/a" if row.problem or base.problem else f"{row.mean - base.mean:+.4f}"
        lines.append(f"{row.strategy} vs {variant.strategy}: {diff} mean accuracy")
    return lines


def _plan(strategy: str, args: argparse.Namespace, gpus: int) -> tuple[Row, list[str]]:
    """The row for ``strategy`` (batch, processes; skipped with why) and its extra flags."""
    if strategy in MULTIPROCESS_STRATEGIES:
        # Ranks that split the model share a batch: the global batch is split over the rest.
        slices, _ = mesh_shape(strategy, args.nproc)
        row = Row(strategy, args.global_batch // slices, args.nproc)
        extra = ["--nproc", str(args.nproc)]
        mesh = [r.cli_message for r in strategy_refusals(strategy, processes=args.nproc, gpus=[])]
        if mesh:
            row.problem = f"skipped: {mesh[0]}"
    else:
        row, extra = Row(strategy, args.global_batch, 1), []
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
    return row, extra


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
