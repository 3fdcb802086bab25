"""A study's table: one cell per distinct config without the seed, its figures pooled over seeds.

Per run, from the stored points (SeriesPoint): the time to target is the `time` (seconds since
the run's start) of the first `test_accuracy` point, by step, at or above the target, and the
images seen are that point's step x the run's global batch. A cell's time to target is the mean
over its runs, and only when every one of its runs reached the target (a mean over the seeds that
happened to get there would flatter the cell); otherwise null, with a note saying how many did.
A run resumed after a lost attempt gives images but no seconds (its clock restarted).

Memory: what the rank that holds the most held at its run's last epoch (parameters, gradients
and optimizer state; core/memory.py), the largest over the cell's runs and ranks, with its share
of the model's parameters, and the highest peak: what the config needs, whichever seed.

Throughput, speedup and efficiency are scaling.py's: the mean images/s of a run's step events,
speedup against the study's own single cell (see `baseline_find`), efficiency = speedup / world
size. Each cell becomes one ScalingRow, so that the chart and the warning about differing global
batches are the compare page's own.

Where the time went: each run's shares of communication, data and waiting
(experiments/metrics/phases.py, from one grouped query over the study's runs), the mean over a
cell's runs that measured them; the scaling view says in a sentence what each cell's efficiency
lost to (``scaling.reasons``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.experiments.core.descriptions import (
    experiment_option_values,
    experiment_options_label,
)
from dashboard.experiments.core.language_fields import LANGUAGE_FIELDS
from dashboard.experiments.core.memory import (
    SUMMARY_FIGURES,
    experiment_memory_rows,
    memory_summary,
)
from dashboard.experiments.metrics.breakdown import experiments_breakdown
from dashboard.experiments.metrics.language import TABLE_FIGURES, runs_language_read
from dashboard.experiments.metrics.phases import run_shares, shares_pooled
from dashboard.experiments.metrics.scaling import (
    ScalingRow,
    batch_warning_text,
    experiment_global_batch,
    scaling_chart_build,
)
from dashboard.experiments.metrics.throughput import throughputs_read
from dashboard.experiments.models import Experiment, SeriesPoint, Status
from dashboard.studies.grid import world_size_of
from dashboard.studies.texts import cell_texts, reached_text
from training.registry import OPTIONS_DECLARED

OPTION_NAMES = tuple(option.name for option in OPTIONS_DECLARED)
# A cell's config: the launch fields that make runs differ, the seed left out; the strategy
# options as the runs train with them (null where the strategy does not read one); a script
# run's entry point and arguments (its args axes' cells differ only there).
CONFIG_FIELDS = (
    "model", "dataset", "data_path", "strategy", "processes", "nodes", "gpus", "epochs",
    "batch_size", "lr", "optimizer", *OPTION_NAMES, "entrypoint", "args", *LANGUAGE_FIELDS,
)  # fmt: skip
ENDED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.LOST)


@dataclass(frozen=True)
class Reached:
    seconds: float
    images: int
    epoch_step: int


def config_of(experiment: Experiment) -> dict[str, Any]:
    options = experiment_option_values(experiment=experiment)
    return {name: options.get(name, getattr(experiment, name)) for name in CONFIG_FIELDS}


def reached_read(*, runs: Sequence[Experiment], target: float) -> dict[int, Reached]:
    """Each run's first test-accuracy point at or above the target (runs that never got there
    are left out)."""
    points = (
        SeriesPoint.objects.filter(
            experiment_id__in=[e.pk for e in runs], key="test_accuracy", value__gte=target
        )
        .order_by("experiment_id", "step", "id")
        .values_list("experiment_id", "step", "time")
    )
    found: dict[int, Reached] = {}
    batches = {e.pk: experiment_global_batch(e) for e in runs}
    for pk, step, time_ in points:
        if pk not in found:
            found[pk] = Reached(seconds=time_, images=step * batches[pk], epoch_step=step)
    return found


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def baseline_find(cell: dict[str, Any], singles: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The study's single cell to compare with: same model, dataset (and folder), learning
    rate, optimizer and epochs, and the same batch per process, else the same global batch;
    else the only one of the same model and dataset (a speedup over another model's run would
    measure the model, not the strategy)."""
    same_data = [
        s for s in singles if all(s["config"][k] == cell["config"][k] for k in
                                  ("model", "dataset", "data_path"))
    ]  # fmt: skip
    alike = [
        s for s in same_data if all(s["config"][k] == cell["config"][k] for k in
                                    ("lr", "optimizer", "epochs"))
    ]  # fmt: skip
    for batch in (cell["config"]["batch_size"], cell["global_batch"]):
        match = next((s for s in alike if s["config"]["batch_size"] == batch), None)
        if match is not None:
            return match
    return same_data[0] if len(same_data) == 1 else None


def _cell_figures(cell: dict[str, Any], runs: list[Experiment], target: float, found: Any) -> None:
    reached, throughputs, breakdowns = found["reached"], found["throughputs"], found["breakdowns"]
    hits = [reached[e.pk] for e in runs if e.pk in reached]
    every = len(hits) == len(runs)
    finals = [
        e.test_accuracy
        for e in runs
        if e.status == Status.SUCCEEDED and e.test_accuracy is not None
    ]
    ips = [throughputs[e.pk] for e in runs if e.pk in throughputs]
    # A resumed run's points restart their clock with each attempt (the engine's time since
    # its own start): its seconds to target would leave out the lost attempt, so none is given.
    resumed = sum(e.attempt > 1 for e in runs if e.pk in reached)
    cell.update(
        time_to_target_seconds=_mean([h.seconds for h in hits]) if every and not resumed else None,
        images_to_target=_mean([h.images for h in hits]) if every else None,
        runs_reached=len(hits),
        runs_ended=sum(e.status in ENDED for e in runs),
        reached_text=reached_text(
            reached=len(hits),
            runs=len(runs),
            target=target,
            finished=sum(e.status in ENDED or e.pk in reached for e in runs),
            resumed=resumed,
        ),  # fmt: skip
        **_cell_memory(runs),
        final_accuracy_mean=_mean(finals),
        final_accuracy_std=statistics.stdev(finals) if len(finals) > 1 else None,
        images_per_second=_mean(ips),
        **_cell_language(runs, found["language"]),
        phase_shares=shares_pooled(
            [shares for e in runs if (shares := run_shares(breakdowns.get(e.pk, [])))]
        ),
    )


def _cell_language(runs: list[Experiment], found: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A language model's cell: the mean over its runs of their tokens/s, MFU and bits per
    byte (metrics/language.py); ``language`` False (and none of them) for a classifier's."""
    figures = [found[e.pk] for e in runs if e.pk in found]
    means = {
        name: _mean([f[name] for f in figures if f[name] is not None]) for name in TABLE_FIGURES
    }
    return {"language": bool(figures), **means}


def _cell_memory(runs: list[Experiment]) -> dict[str, Any]:
    """The cell's memory figures: see the module docstring."""
    summary = memory_summary(row for e in runs for row in experiment_memory_rows(e))
    return {f"memory_{name}": summary[name] for name in SUMMARY_FIGURES}


def cells_build(*, runs: Sequence[Experiment], target: float) -> list[dict[str, Any]]:
    """The table, cells in grid order; see the module docstring for each figure."""
    groups: dict[str, list[Experiment]] = {}
    for run in runs:
        groups.setdefault(repr(sorted(config_of(run).items())), []).append(run)
    found = {
        "reached": reached_read(runs=runs, target=target),
        "throughputs": throughputs_read(experiment_ids=[e.pk for e in runs]),
        "breakdowns": experiments_breakdown(experiment_ids=[e.pk for e in runs]),
        "language": runs_language_read(experiments=runs),
    }
    cells = []
    for members in groups.values():
        first, config = members[0], config_of(members[0])
        cell: dict[str, Any] = {
            "strategy": first.strategy, "processes": first.processes, "nodes": first.nodes,
            # Its options off their default, in the registry's words ("PowerSGD").
            "options_label": experiment_options_label(experiment=first),
            "world_size": world_size_of(config), "global_batch": experiment_global_batch(first),
            "config": config, "runs": [e.pk for e in members],
            "seeds": [e.seed for e in members],
        }  # fmt: skip
        _cell_figures(cell, members, target, found)
        cells.append(cell)
    _speedups_add(cells)
    for cell in cells:
        cell["texts"] = cell_texts(cell)
    return cells


def _speedups_add(cells: list[dict[str, Any]]) -> None:
    singles = [c for c in cells if c["strategy"] == "single"]
    for cell in cells:
        base = baseline_find(cell, singles)
        ips, base_ips = cell["images_per_second"], base and base["images_per_second"]
        speedup = ips / base_ips if ips is not None and base_ips else None
        cell.update(
            baseline=None if base is None else cells.index(base),
            speedup=speedup,
            efficiency=None if speedup is None else speedup / cell["world_size"],
        )


def scaling_rows(cells: list[dict[str, Any]], runs: dict[int, Experiment]) -> list[ScalingRow]:
    """One ScalingRow per cell: the compare page's chart and batch warning read these."""
    rows = []
    for cell in cells:
        base = cells[cell["baseline"]] if cell["baseline"] is not None else None
        rows.append(
            ScalingRow(
                experiment=runs[cell["runs"][0]],
                world_size=cell["world_size"],
                global_batch=cell["global_batch"],
                throughput=cell["images_per_second"],
                baseline=None if base is None else runs[base["runs"][0]],
                baseline_throughput=None if base is None else base["images_per_second"],
                baseline_global_batch=None if base is None else base["global_batch"],
            )
        )
    return rows


def scaling_build(cells: list[dict[str, Any]], runs: dict[int, Experiment]) -> dict[str, Any]:
    """The scaling view: its chart, the batch warning, and per cell with an efficiency what it
    lost to (``reasons``: {cell, text}, the cell's index in the table)."""
    rows = scaling_rows(cells, runs)
    reasons = [
        {"cell": i, "text": cell["texts"]["efficiency_reason"]}
        for i, cell in enumerate(cells)
        if cell["texts"]["efficiency_reason"]
    ]
    return {
        "chart": scaling_chart_build(rows),
        "batch_warning": batch_warning_text(rows),
        "reasons": reasons,
    }
