"""What can be done to studies: create (every run or none), stop, read. The API, the pages and
the admin call these; each returns plain data, so that any view can serve it."""

from __future__ import annotations

import csv
import io
import shlex
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from dashboard.experiments.core.limits import launch_room_refusal, launch_slot_claim
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.services import experiment_launch, experiments_stop
from dashboard.studies.args_axes import is_args_axis
from dashboard.studies.cells import OPTION_NAMES, cells_build, scaling_build
from dashboard.studies.fastest import fastest_build
from dashboard.studies.grid import (
    AXIS_FIELDS,
    StudyRefused,
    StudyRequest,
    cells_skipped,
    study_plan,
)
from dashboard.studies.models import Study, StudyRun
from training.registry import strategy_get

PROGRESS_KEYS = ("queued", "running", "succeeded", "failed", "cancelled")
# The strategy options after the others (added later: a script reading columns by place keeps
# working), each as the cell's runs train with it, empty where the strategy does not read it;
# then a script run's entry point and arguments (empty for the engine's strategies).
CELL_CSV_COLUMNS = (
    "strategy", "processes", "nodes", "world_size", "global_batch", "seeds", "runs",
    "time_to_target_seconds", "images_to_target", "runs_reached", "final_accuracy_mean",
    "final_accuracy_std", "images_per_second", "speedup", "efficiency", "memory_held_bytes",
    "memory_peak_bytes", *OPTION_NAMES, "entrypoint", "args",
)  # fmt: skip


def studies_visible_to(user: Any) -> QuerySet[Study]:
    queryset = Study.objects.select_related("owner")
    if getattr(user, "is_staff", False):
        return queryset
    return queryset.filter(owner_id=user.pk)


def study_can_control(*, study: Study, user: Any) -> bool:
    return bool(getattr(user, "is_staff", False) or study.owner_id == user.pk)


def run_name(*, study_name: str, fields: dict[str, Any], values: dict[str, Any]) -> str:
    """`<study> · DDP ×2 · lr 0.01 · seed 1`: the run's cell and its seed, readable in the list."""
    spec = strategy_get(fields["strategy"])
    parts = [spec.short + (f" ×{fields['processes']}" if spec.processes else "")]
    if fields.get("nodes", 1) != 1:
        parts.append(f"{fields['nodes']} nodes")
    for key in AXIS_FIELDS:
        named = key in values and key not in {"strategy", "processes", "nodes", "seed"}
        # An option the cell's strategy does not read (None) says nothing of the run.
        if named and fields[key] is not None:
            parts.append(f"{key.replace('_', ' ')} {fields[key]}")
    # A script's arguments by their axes' names, as the cell's values say them: "args.lr 0.1".
    parts += [f"{key} {value}" for key, value in values.items() if is_args_axis(key)]
    parts.append(f"seed {fields['seed']}")
    return " · ".join([study_name, *parts])[:200]


def study_create(*, owner: Any, request: StudyRequest) -> Study:
    """Check every cell as one launch (StudyRefused names the first bad one), then store the study
    and queue its runs in one transaction: all of them or none. The study is one launch for the
    owner's limits (LaunchLimited), and its runs wait in the queue past the active-run limit,
    but it asks for room for every run up front: past the owner's bound on runs queued or
    running it is refused whole (StudyRefused, 409), nothing stored."""
    planned = study_plan(owner=owner, request=request)
    target = request.target_accuracy if request.stop_at_target else None
    with transaction.atomic():
        launch_slot_claim(owner=owner, queue_over_active=True)
        # Under the owner's row lock launch_slot_claim took: two studies cannot both fit.
        full = launch_room_refusal(owner=owner, runs=len(planned))
        if full is not None:
            raise StudyRefused(f"the study is not launched: {full}", {"runs": [full]}, status=409)
        study = Study.objects.create(
            owner=owner, name=request.name, base=request.base, axes=request.axes,
            batch_mode=request.batch_mode, target_accuracy=request.target_accuracy,
            stop_at_target=request.stop_at_target,
        )  # fmt: skip
        for position, run in enumerate(planned):
            name = run_name(study_name=study.name, fields=run.fields, values=run.values)
            fields = {**run.fields, "name": name, "target_accuracy": target}
            experiment = experiment_launch(owner=owner, fields=fields, limits=False)
            StudyRun.objects.create(
                study=study, experiment=experiment, position=position, values=run.values
            )
    return study


def study_runs(study: Study) -> list[Experiment]:
    return [
        link.experiment
        for link in study.study_runs.select_related("experiment", "experiment__owner")
    ]


def study_stop(*, study: Study, by: Any) -> dict[str, Any]:
    """Stop the running runs and cancel the queued ones (experiments_stop: the queue woken once)."""
    Study.objects.filter(pk=study.pk, stopped_at__isnull=True).update(
        stopped_at=timezone.now(), stopped_by=by
    )
    stopping = experiments_stop(experiments=study_runs(study), by=by)
    study.refresh_from_db()
    return {"id": study.pk, "stopping": stopping, "stopped_at": study.stopped_at.isoformat()}


def study_progress(runs: list[Experiment]) -> dict[str, int]:
    counts = dict.fromkeys(PROGRESS_KEYS, 0)
    for run in runs:
        key = "failed" if run.status == Status.LOST else run.status
        counts[key] = counts.get(key, 0) + 1
    return {**counts, "total": len(runs)}


def study_status(*, study: Study, progress: dict[str, int]) -> str:
    """queued (nothing started), running, then once every run has ended: cancelled (the study
    was stopped), failed (a run failed), succeeded (all did) or done (some runs were stopped)."""
    if progress["running"] or progress["queued"]:
        started = progress["total"] - progress["queued"]
        return "running" if started else "queued"
    if study.stopped_at is not None and progress["cancelled"]:
        return "cancelled"
    if progress["failed"]:
        return "failed"
    return "succeeded" if progress["succeeded"] == progress["total"] else "done"


def _run_row(link: StudyRun) -> dict[str, Any]:
    e = link.experiment
    return {
        "id": e.pk, "name": e.name, "status": e.status, "strategy": e.strategy,
        "processes": e.processes, "seed": e.seed, "values": link.values,
        "test_accuracy": e.test_accuracy, "url": e.get_absolute_url(),
    }  # fmt: skip


def study_summary(study: Study, runs: list[Experiment]) -> dict[str, Any]:
    progress = study_progress(runs)
    return {
        "id": study.pk, "name": study.name, "owner": study.owner.get_username(),
        "status": study_status(study=study, progress=progress), "progress": progress,
        "target_accuracy": study.target_accuracy, "stop_at_target": study.stop_at_target,
        "batch_mode": study.batch_mode, "created_at": study.created_at.isoformat(),
        "stopped_at": study.stopped_at.isoformat() if study.stopped_at else None,
        "url": study.get_absolute_url(),
    }  # fmt: skip


def study_as_dict(study: Study) -> dict[str, Any]:
    """GET /api/studies/<id>/: the study, its runs, and its table (cells.py) with the chart."""
    links = list(study.study_runs.select_related("experiment", "experiment__owner"))
    runs = [link.experiment for link in links]
    cells = cells_build(runs=runs, target=study.target_accuracy)
    return {
        **study_summary(study, runs),
        "base": study.base,
        "axes": study.axes,
        # Ids, as POST answers them; each run's status and cell in run_details.
        "runs": [e.pk for e in runs],
        "run_details": [_run_row(link) for link in links],
        "cells": cells,
        # Which cell reached the target first, and the sentence the page says it in.
        **fastest_build(cells=cells, axes=study.axes, target=study.target_accuracy),
        # Cells not run: their strategy does not read an option they set (grid.py).
        "skipped": [cell.as_dict() for cell in cells_skipped(base=study.base, axes=study.axes)],
        "scaling": scaling_build(cells, {e.pk: e for e in runs}),
    }


def studies_list(*, user: Any) -> list[dict[str, Any]]:
    """GET /api/studies/: the viewer's studies, newest first, with their progress."""
    studies = list(studies_visible_to(user).prefetch_related("study_runs__experiment"))
    return [
        study_summary(study, [link.experiment for link in study.study_runs.all()])
        for study in studies
    ]


def study_cells_csv(study: Study) -> str:
    """The table as CSV: one row per cell, the figures unrounded."""
    cells = study_as_dict(study)["cells"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CELL_CSV_COLUMNS)
    for cell in cells:
        row = [cell[key] if key in cell else cell["config"][key] for key in CELL_CSV_COLUMNS]
        writer.writerow(
            [
                # A list (a script's args) as a shell writes it: an argument with a space stays one.
                shlex.join(map(str, v)) if isinstance(v, list) else ("" if v is None else v)
                for v in row
            ]
        )
    return out.getvalue()
