"""Scaling figures: throughput, speedup against a `single` run, efficiency, and the batch caveat.

Throughput is throughput.py's, the one every page shows: the images trained over the wall time of
the step windows that trained them (all ranks together); a run with no step event (a --dry-run)
is read from its epoch events.

The baseline of a run is the newest succeeded `single` run the viewer can see with the *same
config*: the same model and dataset (and image folder), epochs, batch size per process and
optimizer, on the same machine (worker) and the same kind of device (the CPU for a CPU run, one
GPU for a run with GPUs). The learning rate and seed are left out: they change what is learnt,
not how fast. A `single` run is its own baseline. Speedup = throughput / the baseline's;
efficiency = speedup / world size.

World size is the number of workers a strategy spreads the work over: processes for DDP, Hogwild
and DeepSpeed; GPUs for DataParallel, its primitives and model parallel (1 on the CPU).

Matching the batch size per process makes DDP's global batch (batch x processes) larger than the
baseline's, while DataParallel splits one batch across its GPUs: runs that look alike then train on
different global batches, which changes throughput and accuracy alike. Pages warn where they differ,
saying how each compared strategy makes its global batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.experiments.core.access import experiments_visible_to
from dashboard.experiments.core.memory import experiment_memory_rows, memory_summary
from dashboard.experiments.metrics.breakdown import experiments_breakdown
from dashboard.experiments.metrics.language import TABLE_FIGURES, runs_language_read, table_texts
from dashboard.experiments.metrics.phases import (
    RunShares,
    efficiency_reason_text,
    run_shares,
    shares_text,
)
from dashboard.experiments.metrics.throughput import throughputs_read
from dashboard.experiments.models import (
    PROCESS_STRATEGIES,
    Experiment,
    Status,
    Strategy,
)
from training.registry import REGISTRY, global_batch_size, global_batch_words, strategy_get

# The compare page is one table: a handful of runs, not a report.
COMPARE_MAX_RUNS = 20
# Candidates looked at for a baseline before giving up: the newest ones only.
BASELINE_CANDIDATES = 10
NO_BASELINE = "no single baseline"
# experiment_world_size below, in words; the strategies' names from the registry.
WORLD_SIZE_RULE = (
    "Efficiency: speedup ÷ world size, where world size counts processes ("
    + ", ".join(spec.short for spec in REGISTRY if spec.processes)
    + ") or GPUs ("
    + ", ".join(spec.label for spec in REGISTRY if not spec.processes and spec.name != "single")
    + "; 1 on the CPU)."
)
BASELINE_RULE = (
    "Baseline: the newest succeeded single-device run you can see with the same model, dataset, "
    "epochs, batch size per process and optimizer, on the same machine and the same kind of "
    "device (CPU, or one GPU for runs on GPUs)."
)


def experiment_world_size(experiment: Experiment) -> int:
    reported = (experiment.run_info or {}).get("world_size")
    if experiment.strategy in PROCESS_STRATEGIES:
        if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
            return reported
        return max(1, experiment.processes)
    if experiment.strategy == Strategy.SINGLE:
        return 1
    return max(1, len(experiment.gpus or []))


def experiment_global_batch(experiment: Experiment) -> int:
    """Images per optimizer step over all workers, as reported, else as configured."""
    reported = (experiment.run_info or {}).get("global_batch_size")
    if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
        return reported
    # As the engine will count it (training/registry.py): a tensor-parallel group shares one.
    try:
        return global_batch_size(
            experiment.strategy,
            batch_size=experiment.batch_size,
            accumulate=experiment.accumulate or 1,
            world=max(1, experiment.processes) * max(1, experiment.nodes),
        )
    except ValueError:  # a strategy the registry no longer has: as one batch a process
        return experiment.batch_size * max(1, experiment.processes) * (experiment.accumulate or 1)


def single_baseline_find(
    *, experiment: Experiment, candidates: Any, throughputs: dict[int, float]
) -> Experiment | None:
    """The newest matching single run that has a throughput; see the module docstring."""
    if experiment.strategy == Strategy.SINGLE:
        return experiment
    if not experiment.worker:
        return None  # not started: the machine, and so the baseline, is not known yet
    matches = candidates.filter(
        strategy=Strategy.SINGLE,
        status=Status.SUCCEEDED,
        # Another model (or other data) would make the speedup measure the model, not the
        # strategy: only a run of the same model on the same data is a baseline.
        model=experiment.model,
        dataset=experiment.dataset,
        data_path=experiment.data_path,
        epochs=experiment.epochs,
        batch_size=experiment.batch_size,
        optimizer=experiment.optimizer,
        worker=experiment.worker,
    ).exclude(pk=experiment.pk)
    # The same kind of device: a GPU run against a one-GPU single run, a CPU run against CPU.
    matches = matches.exclude(gpus=[]) if experiment.gpus else matches.filter(gpus=[])
    found = list(matches.order_by("-finished_at", "-id")[:BASELINE_CANDIDATES])
    throughputs.update(throughputs_read(experiment_ids=[c.pk for c in found]))
    return next((c for c in found if c.pk in throughputs), None)


def throughput_text(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} img/s"


@dataclass(frozen=True)
class ScalingRow:
    experiment: Experiment
    world_size: int
    global_batch: int
    throughput: float | None
    baseline: Experiment | None
    baseline_throughput: float | None
    baseline_global_batch: int | None
    # Its shares of communication, data and waiting (metrics/phases.py), None without phases.
    shares: RunShares | None = None
    # A language model's tokens/s, MFU and bits per byte (metrics/language.py), None else.
    language: dict[str, Any] | None = None

    @property
    def speedup(self) -> float | None:
        if self.throughput is None or not self.baseline_throughput:
            return None
        return self.throughput / self.baseline_throughput

    @property
    def efficiency(self) -> float | None:
        speedup = self.speedup
        return None if speedup is None else speedup / self.world_size

    @property
    def accuracy(self) -> float | None:
        return self.experiment.test_accuracy

    @property
    def memory_rows(self) -> list[dict[str, Any]]:
        """What each rank held at the run's last epoch, as core/memory.py writes it."""
        return experiment_memory_rows(self.experiment)

    @property
    def memory(self) -> dict[str, Any]:
        """The largest rank's held bytes and the highest peak: the compare page's memory cell."""
        return memory_summary(self.memory_rows)

    @property
    def texts(self) -> dict[str, str]:
        """The figures as the pages show them (static/js/run_facts.js writes the same)."""
        speedup, efficiency = self.speedup, self.efficiency
        return {
            "throughput": throughput_text(self.throughput),
            "baseline_throughput": throughput_text(self.baseline_throughput),
            "speedup": "—" if speedup is None else f"{speedup:.2f}×",
            "efficiency": "—" if efficiency is None else f"{efficiency:.0%}",
            "accuracy": "—" if self.accuracy is None else f"{self.accuracy:.2%}",
            "phase_shares": shares_text(self.shares),
            "efficiency_reason": efficiency_reason_text(efficiency=efficiency, shares=self.shares)
            or "",
            **table_texts(self.language),
        }

    def as_dict(self) -> dict[str, Any]:
        e, base, memory = self.experiment, self.baseline, self.memory
        return {
            "id": e.pk,
            "name": e.name,
            "url": e.get_absolute_url(),
            "status": e.status,
            "strategy": e.strategy,
            "model": e.model,
            "dataset": e.dataset,
            "batch_size": e.batch_size,
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "throughput": self.throughput,
            "baseline": None
            if base is None
            else {
                "id": base.pk,
                "url": base.get_absolute_url(),
                "throughput": self.baseline_throughput,
                "global_batch": self.baseline_global_batch,
            },
            "speedup": self.speedup,
            "efficiency": self.efficiency,
            "test_accuracy": self.accuracy,
            # Each rank's entry at the last epoch, as the run's read JSON has it, and the
            # largest rank's parameter + gradient + optimizer bytes and the highest peak.
            "memory": e.memory,
            "memory_held_bytes": memory["held_bytes"],
            "memory_peak_bytes": memory["peak_bytes"],
            # Shares of communication, data and waiting over the run (metrics/phases.py), and
            # what its efficiency lost to, in words; null without phases (or efficiency).
            "phase_shares": self.shares,
            "efficiency_reason": self.texts["efficiency_reason"] or None,
            # A language model's (metrics/language.py): null for the other models.
            **{key: (self.language or {}).get(key) for key in TABLE_FIGURES},
        }


def scaling_rows_build(*, experiments: Sequence[Experiment], visible: Any) -> list[ScalingRow]:
    """One row per run; `visible` is the queryset of runs the viewer may use as baselines."""
    throughputs = throughputs_read(experiment_ids=[e.pk for e in experiments])
    breakdowns = experiments_breakdown(experiment_ids=[e.pk for e in experiments])
    language = runs_language_read(experiments=experiments)
    rows = []
    for experiment in experiments:
        baseline = single_baseline_find(
            experiment=experiment, candidates=visible, throughputs=throughputs
        )
        rows.append(
            ScalingRow(
                experiment=experiment,
                world_size=experiment_world_size(experiment),
                global_batch=experiment_global_batch(experiment),
                throughput=throughputs.get(experiment.pk),
                baseline=baseline,
                baseline_throughput=None if baseline is None else throughputs.get(baseline.pk),
                baseline_global_batch=None
                if baseline is None
                else experiment_global_batch(baseline),
                shares=run_shares(breakdowns.get(experiment.pk, [])),
                language=language.get(experiment.pk),
            )
        )
    return rows


def batch_warning_text(rows: Sequence[ScalingRow]) -> str | None:
    """A warning when the compared runs do not all train on the same global batch."""
    if len({row.global_batch for row in rows}) < 2:
        return None
    sizes = ", ".join(
        f"#{row.experiment.pk} {row.experiment.strategy} {row.global_batch}" for row in rows
    )
    strategies = list(dict.fromkeys(_strategy_label(row.experiment) for row in rows))
    made = "; ".join(dict.fromkeys(_global_batch_made(row.experiment) for row in rows))
    return (
        f"Global batch sizes differ ({sizes}). A larger global batch means fewer optimizer steps "
        "per epoch, so higher images/s and a different accuracy: these runs differ by more "
        f"than their strategies ({_and(strategies)}). Each step here takes {made}. To compare "
        "the strategies, give every run the same global batch."
    )


def _strategy_label(experiment: Experiment) -> str:
    try:
        return strategy_get(experiment.strategy).label
    except ValueError:  # a strategy the registry no longer has: its stored name
        return experiment.strategy


def _global_batch_made(experiment: Experiment) -> str:
    """How a run's global batch is made, in words: "DistributedDataParallel 64 a process x 2
    processes" (the registry's words for experiment_global_batch's rule)."""
    label = _strategy_label(experiment)
    try:
        words = global_batch_words(
            experiment.strategy,
            batch_size=experiment.batch_size,
            accumulate=experiment.accumulate or 1,
            world=max(1, experiment.processes) * max(1, experiment.nodes),
        )
    except ValueError:  # a strategy the registry no longer has
        return label
    return f"{label} {words}"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def baseline_batch_note(row: ScalingRow) -> str | None:
    """On a run's page: the run and its baseline train on different global batches."""
    if row.baseline is None or row.baseline_global_batch in (None, row.global_batch):
        return None
    return (
        f"This run's global batch is {row.global_batch} images, its baseline's "
        f"{row.baseline_global_batch}: the speedup compares images/s at the same batch per "
        "process; accuracy differs partly for that reason."
    )


MAX_RUN_ID = 2**63 - 1


def compare_ids_parse(values: list[str]) -> list[int]:
    """`?ids=1,2,3` from a script or `?ids=1&ids=2` from the list's checkboxes; order kept."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            # ASCII digits within a database id: isdigit() takes "²" (int() then fails), and a
            # longer number overflowed SQLite's integers in the lookup (a 500).
            if not (part.isascii() and part.isdigit() and len(part) < 20) or int(part) > MAX_RUN_ID:
                raise ValueError(f"run ids are whole numbers up to {MAX_RUN_ID}, not {part[:40]!r}")
            if int(part) not in ids:
                ids.append(int(part))
    if len(ids) > COMPARE_MAX_RUNS:
        raise ValueError(f"compare at most {COMPARE_MAX_RUNS} runs at once, not {len(ids)}")
    return ids


def comparison_build(*, user: Any, ids: list[int]) -> dict[str, Any]:
    """The compare table for the runs among `ids` the user may see; the others are `missing`."""
    visible = experiments_visible_to(user)
    found = {e.pk: e for e in visible.filter(pk__in=ids)}
    experiments = [found[pk] for pk in ids if pk in found]
    rows = scaling_rows_build(experiments=experiments, visible=visible)
    return {
        "rows": rows,
        "missing": [pk for pk in ids if pk not in found],
        "batch_warning": batch_warning_text(rows),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def scaling_chart_build(rows: Sequence[ScalingRow]) -> dict[str, Any]:
    """The compare page's chart of speedup and efficiency against world size: one line per
    strategy, its value at a world size the mean over the compared runs with a speedup."""
    measured = [row for row in rows if row.speedup is not None]
    sizes = sorted({row.world_size for row in measured})
    lines = []
    for strategy in dict.fromkeys(row.experiment.strategy for row in measured):
        speedups = [
            _mean(
                [
                    float(row.speedup or 0)
                    for row in measured
                    if row.experiment.strategy == strategy and row.world_size == size
                ]
            )
            for size in sizes
        ]
        efficiency = [
            None if s is None else s / size for s, size in zip(speedups, sizes, strict=True)
        ]
        lines.append({"strategy": strategy, "speedup": speedups, "efficiency": efficiency})
    return {"world_sizes": sizes, "lines": lines}
