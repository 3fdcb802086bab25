"""``python -m training.bench parity``: the same training, strategy by strategy: same accuracy,
at what speed, holding how much?

Runs ``python -m training`` once per strategy and seed (``--seeds``, default 1,2,3) with the same
dataset, epochs and GLOBAL batch (``--global-batch``, default 64): single, dp and model-parallel
take the whole global batch in one process; ddp, hogwild, deepspeed and fsdp run ``--nproc``
processes (default 2) with ``--batch-size`` global batch / nproc each; the ranks of
tensor-parallel and the stages of pipeline train on one batch together (the whole global batch;
pipeline in its default 4 micro-batches, GPipe, over as many stages as ``--nproc``: the built-in
model has 2), and fsdp-tp's pairs each on global batch / (nproc / 2), so it runs where
``--nproc`` is even and 4 or more (skipped, with why, otherwise). The default list is every
strategy of the registry (``training/registry.py``), so a strategy added there appears here by
itself. Each run's accuracy is the ``test_accuracy`` of its ``finished`` event.

A strategy may carry its options (``training/registry.py``) as ``name:option=value``, each such
row beside the plain one (added where the list lacks it): ``single:precision=bf16`` trains under
bfloat16 autocast, ``ddp:accumulate=2`` adds up 2 batches a step, each half the size (global
batch / nproc / 2 images), so that the step still takes the global batch; ``ddp:comm_hook=fp16``
and ``ddp:comm_hook=powersgd`` compress DDP's gradient all-reduce. A switch is given by its name
alone or as ``=true``: ``ddp:shard_optimizer`` (``ZeroRedundancyOptimizer``). Options join with
more colons: ``ddp:comm_hook=fp16:accumulate=2``. The defaults add ``single:precision=bf16``,
``ddp:precision=bf16``, ``ddp:accumulate=2``, ``ddp:comm_hook=fp16``, ``ddp:comm_hook=powersgd``,
``ddp:comm_hook=bf16`` and ``ddp:shard_optimizer`` to every strategy of the registry. A value
refused on this machine (``training.refusals.option_refusals``: the bf16 hook on Gloo, fp16
autocast without GPUs) is shown as skipped with the refusal's reason.

The accuracy table shows per strategy the per-process batch, the processes, the accuracy for
each seed, their mean, their spread (max - min: how far seeds alone move a strategy), the
mean's difference from single's mean and, for a variant, from its plain strategy's mean
(``vs plain``) with the verdict against ``--margin`` (default 0.02, two accuracy points):
``within`` where the difference is at most the margin either way, else ``OUTSIDE``. The issue
asks that compressed communication (fp16, PowerSGD) trains to within that margin of DDP.

The second table, throughput and memory per rank, is taken from the same runs' ``epoch`` events
(protocol 1.7): images/s (the epochs' ``images_per_second``, all ranks together, meaned over the
seeds) and its ratio to single's; and, from the last epoch's ``memory``, the bytes the rank that
holds most keeps of parameters, gradients and optimizer state, their sum's ratio to single's
(``state x single``: FSDP's 1/N shows here) and the peak (RSS on the CPU: interpreter, torch and
data included). Where the ranks hold different amounts (``shard_optimizer`` keeps whole
parameters per rank, so one rank may keep nearly all), a line under the table gives each rank's.

The last line, ``parity ratio``, is the smallest mean accuracy / single's mean accuracy over
the strategies that ran: 1.0 means no strategy trains worse than one process.

Strategies this machine cannot run are shown as skipped with the reason (deepspeed where the
package is not installed, dp-primitives with fewer than 2 GPUs); a strategy whose run fails is
shown as failed with the first line of its error and left out of the ratio. Without single there
is nothing to compare with: the command then exits 1. On a machine with GPUs, dp and
dp-primitives get ``--gpus`` (they need it there); the others train on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from training.bench.launch import training_command, training_env
from training.catalogue import MODEL_DEFAULT
from training.cli import package_available
from training.config import DATASETS
from training.models.build import model_stage_limit
from training.protocol import MemoryEntry, parse_event
from training.refusals import option_refusals, pipeline_refusals, strategy_refusals
from training.registry import (
    ENGINE_STRATEGIES,
    MULTIPROCESS_STRATEGIES,
    SWITCH,
    OptionValue,
    StrategyOption,
    mesh_shape,
    strategy_get,
)

# Every strategy the engine trains (single first: the others are compared with it; not a user's
# own script, which trains no model of ours), then the options beside fp32, one batch a step and
# DDP's plain all-reduce.
DEFAULT_STRATEGIES = (
    *ENGINE_STRATEGIES,
    "single:precision=bf16",
    "ddp:precision=bf16",
    "ddp:accumulate=2",
    "ddp:comm_hook=fp16",
    "ddp:comm_hook=powersgd",
    "ddp:comm_hook=bf16",
    "ddp:shard_optimizer",
)
MARGIN_DEFAULT = 0.02  # test accuracy (a fraction): two points


@dataclass(frozen=True)
class Variant:
    """A strategy with some of its options: ``ddp:accumulate=2``."""

    strategy: str
    options: tuple[tuple[StrategyOption, OptionValue], ...] = ()

    @property
    def label(self) -> str:
        return " ".join([self.strategy, *(_option_text(o, v) for o, v in self.options)])

    @property
    def plain(self) -> Variant:
        """The strategy without options, which a variant is compared with."""
        return Variant(self.strategy)

    @property
    def accumulate(self) -> int:
        return next((int(v) for o, v in self.options if o.name == "accumulate"), 1)

    def flags(self) -> list[str]:
        return [word for option, value in self.options for word in option.cli_args(value)]


def _option_text(option: StrategyOption, value: OptionValue) -> str:
    """``comm_hook=fp16``; a switch that is on by its name alone: ``shard_optimizer``."""
    return option.name if option.kind == SWITCH and value is True else f"{option.name}={value}"


def variant_parse(text: str) -> Variant:
    """``name`` or ``name:option=value[:option=value]``, a switch also as ``name:option``; a
    ValueError says what is wrong."""
    name, *pairs = text.split(":")
    if name not in ENGINE_STRATEGIES:
        raise ValueError(f"unknown strategy {name} (the engine's: {', '.join(ENGINE_STRATEGIES)})")
    taken = {option.name: option for option in strategy_get(name).options}
    options = []
    for pair in pairs:
        key, equals, word = pair.partition("=")
        if key not in taken:
            takes = f"it takes {', '.join(taken)}" if taken else "it takes none"
            raise ValueError(f"{name} takes no option {key!r} ({takes})")
        option = taken[key]
        if not equals and option.kind == SWITCH:
            word = "true"
        value = next((v for v in option.values if str(v).lower() == word.lower()), None)
        if value is None:
            raise ValueError(f"{text}: {option.invalid_text()}")
        options.append((option, value))
    return Variant(name, tuple(options))


@dataclass(frozen=True)
class RunResult:
    """What one finished run reported: its accuracy and, from its epoch events, throughput and
    each rank's memory (empty where the events carry none)."""

    accuracy: float
    images_per_second: float
    memory: tuple[MemoryEntry, ...] = ()


@dataclass
class Row:
    variant: Variant
    batch: int  # per process (per micro-batch with accumulate)
    procs: int
    runs: list[RunResult] = field(default_factory=list)
    problem: str = ""  # "skipped: ..." or "failed: ...", else empty

    @property
    def strategy(self) -> str:  # the variant's label: "ddp accumulate=2"
        return self.variant.label

    @property
    def accuracies(self) -> list[float]:
        return [run.accuracy for run in self.runs]

    @property
    def mean(self) -> float:
        return statistics.mean(self.accuracies)

    @property
    def spread(self) -> float:
        return max(self.accuracies) - min(self.accuracies)

    @property
    def images_per_second(self) -> float:
        return statistics.mean(run.images_per_second for run in self.runs)

    @property
    def memory(self) -> tuple[MemoryEntry, ...]:
        """The last run's ranks (their state bytes are the same every seed; peaks vary)."""
        return self.runs[-1].memory

    def held(self, part: int | None = None) -> int:
        """The most any rank holds of its state's ``part`` (``state_bytes``' order), or of all of
        it where None."""
        return max((_held(state_bytes(e), part) for e in self.memory), default=0)

    @property
    def peak(self) -> int:
        return max((int(e["peak_bytes"]) for e in self.memory), default=0)


def state_bytes(entry: MemoryEntry) -> tuple[int, int, int]:
    """What a rank holds of its model's state: parameters, gradients, optimizer state."""
    return entry["parameter_bytes"], entry["gradient_bytes"], entry["optimizer_state_bytes"]


def _held(state: tuple[int, int, int], part: int | None) -> int:
    return sum(state) if part is None else state[part]


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
        help=f"comma-separated (default: {','.join(DEFAULT_STRATEGIES)}); single always runs, "
        "and so does each variant's plain strategy",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=MARGIN_DEFAULT,
        help="how far a variant's mean accuracy may be from its plain strategy's, either way "
        f"(a fraction; default {MARGIN_DEFAULT}: two points)",
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
    _table_print(rows, seeds, base, args.margin)
    _margin_print(rows, args.margin)
    print()
    _figures_print(rows)
    if base is None:
        print("parity ratio: n/a (single failed)")
        return 1
    ratio = min(row.mean / base for row in rows if not row.problem)
    print(f"parity ratio: {ratio:.3f}")
    return 0


def _args_parse(argv: list[str]) -> tuple[argparse.Namespace, list[int], list[Variant]]:
    """The options, the seeds and the strategies (plain single first, each variant after its
    plain strategy); exits on a bad one."""
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
    ordered = [Variant("single")]
    for variant in strategies:
        ordered += [v for v in dict.fromkeys((variant.plain, variant)) if v not in ordered]
    return args, seeds, ordered


def _row_run(variant: Variant, seeds: list[int], args: argparse.Namespace, gpus: int) -> Row:
    """``variant``'s row: one run per seed, until one fails (or skipped, with why)."""
    row, extra = _plan(variant, args, gpus)
    if row.problem:
        return row
    for seed in seeds:
        print(f"parity: {variant.label} seed {seed} ...", file=sys.stderr, flush=True)
        result, error = run_one(variant.strategy, seed, row.batch, extra, args)
        if result is None:
            row.problem = f"failed: {error}"
            break
        row.runs.append(result)
    return row


def _table_print(rows: list[Row], seeds: list[int], base: float | None, margin: float) -> None:
    seed_cols = " ".join(f"{'seed ' + str(s):>8}" for s in seeds)
    print(
        f"{'strategy':<24} {'batch/proc':>10} {'procs':>5} {seed_cols} {'mean':>8} "
        f"{'spread':>8} {'vs single':>9} {'vs plain':>9} {'margin':>8}"
    )
    means = _means(rows)
    for row in rows:
        head = f"{row.strategy:<24} {row.batch:>10} {row.procs:>5}"
        if row.problem:
            print(f"{head} {row.problem}")
            continue
        accs = " ".join(f"{a:8.4f}" for a in row.accuracies)
        diff = f"{row.mean - base:+9.4f}" if base is not None else f"{'n/a':>9}"
        plain = _vs_plain(row, means, margin)
        print(f"{head} {accs} {row.mean:8.4f} {row.spread:8.4f} {diff} {plain}")


def _vs_plain(row: Row, means: dict[Variant, float], margin: float) -> str:
    """The difference from the plain strategy's mean and the verdict; dashes for a plain row."""
    plain = row.variant.plain
    if plain == row.variant:
        return f"{'-':>9} {'-':>8}"
    if plain not in means:
        return f"{'n/a':>9} {'n/a':>8}"
    diff = row.mean - means[plain]
    return f"{diff:+9.4f} {'within' if abs(diff) <= margin else 'OUTSIDE':>8}"


def _means(rows: list[Row]) -> dict[Variant, float]:
    return {row.variant: row.mean for row in rows if not row.problem}


def _margin_print(rows: list[Row], margin: float) -> None:
    means = _means(rows)
    judged = [
        row
        for row in rows
        if not row.problem and row.variant.plain != row.variant and row.variant.plain in means
    ]
    within = [row for row in judged if abs(row.mean - means[row.variant.plain]) <= margin]
    outside = ", ".join(row.strategy for row in judged if row not in within)
    print(
        f"margin {margin:.4f} ({margin * 100:g} accuracy points) of the plain strategy's mean: "
        f"{len(within)} of {len(judged)} variant(s) within"
        + (f"; outside: {outside}" if outside else "")
    )


def _figures_print(rows: list[Row]) -> None:
    """The second table: images/s and what the rank that holds most keeps, with ratios."""
    print(
        "throughput and memory per rank: images/s of the epoch events (all ranks together, "
        "mean over seeds); bytes held by the rank holding most, from the last epoch's memory"
    )
    print(
        f"{'strategy':<24} {'images/s':>9} {'x single':>8} {'params':>10} {'grads':>10} "
        f"{'optimizer':>10} {'state x single':>14} {'peak':>10}"
    )
    single = rows[0]
    for row in rows:
        if row.problem:
            print(f"{row.strategy:<24} {row.problem.split(':')[0]}")
            continue
        speed = _ratio(row.images_per_second, 0 if single.problem else single.images_per_second)
        state = _ratio(row.held(), 0 if single.problem else single.held())
        sizes = " ".join(f"{size_text(row.held(part)):>10}" for part in range(3))
        print(
            f"{row.strategy:<24} {row.images_per_second:9.1f} {speed:>8} {sizes} {state:>14} "
            f"{size_text(row.peak):>10}"
        )
    for row in rows:
        if not row.problem and _ranks_differ(row.memory):
            each = "; ".join(
                f"rank {e['rank']} " + " / ".join(map(size_text, state_bytes(e)))
                for e in row.memory
            )
            print(f"  {row.strategy}: {each} (params / grads / optimizer)")


def _ranks_differ(memory: tuple[MemoryEntry, ...]) -> bool:
    """Whether some rank holds a tenth less state than another (ZeRO-1's whole parameters)."""
    held = [sum(state_bytes(e)) for e in memory]
    return len(held) > 1 and min(held) < 0.9 * max(held)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base and value else "n/a"


def size_text(value: int) -> str:
    """Binary units for a terminal: "512 B", "158.1 KiB", "6.2 MiB"."""
    amount = float(value)
    for unit in ("B", "KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"


def _plan(variant: Variant, args: argparse.Namespace, gpus: int) -> tuple[Row, list[str]]:
    """The row for ``variant`` (batch, processes; skipped with why) and its extra flags."""
    strategy, accumulate = variant.strategy, variant.accumulate
    if strategy in MULTIPROCESS_STRATEGIES:
        # Ranks that split the model share a batch: the global batch is split over the rest.
        slices, _ = mesh_shape(strategy, args.nproc)
        row = Row(variant, args.global_batch // slices // accumulate, args.nproc)
        extra = ["--nproc", str(args.nproc)]
        mesh = [r.cli_message for r in strategy_refusals(strategy, processes=args.nproc, gpus=[])]
        mesh += [
            r.cli_message
            for r in pipeline_refusals(
                strategy, processes=args.nproc, batch_size=row.batch,
                microbatches=None, schedule=None,
                # The bench trains the default model: more stages than it has are skipped.
                stages=model_stage_limit(MODEL_DEFAULT) if strategy_get(strategy).stages else None,
            )
        ]  # fmt: skip
        if mesh:
            row.problem = f"skipped: {mesh[0]}"
    else:
        row, extra = Row(variant, args.global_batch // accumulate, 1), []
    spec = strategy_get(strategy)
    ids: list[int] = []
    if spec.requires is not None and not package_available(spec.requires.module):
        row.problem = f"skipped: the {spec.requires.module} package is not installed"
    if spec.min_gpus:
        if gpus < spec.min_gpus:
            row.problem = f"skipped: needs {spec.min_gpus} or more GPUs, this machine has {gpus}"
        else:
            ids = list(range(spec.min_gpus))
    if spec.gpus_where_present and gpus:
        ids = list(range(min(gpus, 2)))
    values = {option.name: value for option, value in variant.options}
    refused = option_refusals(strategy, values=values, gpus=ids)
    if refused and not row.problem:
        row.problem = f"skipped: {refused[0][0].flag} {refused[0][1]}"
    if ids:
        extra = ["--gpus", ",".join(map(str, ids))]
    return row, [*extra, *variant.flags()]


def run_one(
    strategy: str, seed: int, batch: int, extra: list[str], args: argparse.Namespace
) -> tuple[RunResult | None, str]:
    """(what a finished run reported, "") , else (None, the first line of its error)."""
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
    epochs = [e for e in events if e["type"] == "epoch"]
    if proc.returncode == 0 and finished and epochs:
        return RunResult(
            accuracy=float(finished[-1]["test_accuracy"] or 0.0),
            images_per_second=statistics.mean(float(e["images_per_second"]) for e in epochs),
            memory=tuple(epochs[-1].get("memory") or ()),
        ), ""
    failed = [e for e in events if e["type"] == "failed"]
    if failed and str(failed[-1].get("error", "")).strip():
        return None, str(failed[-1]["error"]).strip().splitlines()[0]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return None, lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
