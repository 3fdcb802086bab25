"""Finished runs that carry every series of the contract, made directly in the database (no
training): what the layout browser tests read (tests/test_pages_browser.py). A DDP run of two
ranks and its single-device baseline, in a study of both: each with the run's step and epoch
figures, every rank's figures, phases, arrivals and memory, a machine's CPU, and log lines. Its
values are the ones the issue saw break the axes: a learning rate in 1e-4 steps and memory
figures around a GiB."""

from __future__ import annotations

import datetime
import math
from typing import Any

from django.utils import timezone

from dashboard.experiments.metrics.series_contract import (
    ARRIVAL_FIELDS,
    EPOCH_SERIES,
    MEMORY_FIELDS,
    PHASE_FIELDS,
    RANK_FIELDS,
    STEP_SERIES,
)
from dashboard.experiments.models import Experiment, LogLine, SeriesPoint, Status
from dashboard.studies.models import Study, StudyRun

STEPS = 60
EPOCHS = 3
GIB = 1024**3


def _value(key: str, step: int, rank: int) -> float:
    field = key.rsplit("/", 1)[-1]
    if key == "lr":
        return 1e-4 * (1 + (step * 3) // STEPS)  # 1e-4, 2e-4, 3e-4: steps of 1e-4
    if key in ("train_loss", "test_loss"):
        return 2.0 * math.exp(-3.0 * step / STEPS) + 0.05
    if key == "test_accuracy":
        return 0.5 + 0.45 * step / STEPS
    if field.endswith("_bytes"):
        return GIB + (step % 7) * 1024**2 + rank * 512 * 1024  # around a GiB, a few MiB apart
    if field.endswith("_seconds"):
        return 0.01 + 0.001 * (step % 5) + 0.002 * rank
    if field == "collectives":
        return 4.0
    if field == "cpu_percent":
        return 40.0 + step % 20
    return 900.0 + step % 50  # images/s


def _run(owner: Any, name: str, *, strategy: str, processes: int) -> Experiment:
    started = timezone.now() - datetime.timedelta(minutes=10)
    return Experiment.objects.create(
        owner=owner,
        name=name,
        status=Status.SUCCEEDED,
        strategy=strategy,
        processes=processes,
        batch_size=64 // processes,
        epochs=EPOCHS,
        epoch=EPOCHS,
        step=STEPS,
        total_steps=STEPS,
        started_at=started,
        finished_at=started + datetime.timedelta(minutes=5),
        test_accuracy=0.95,
        test_loss=0.16,
        run_info={"global_batch_size": 64, "world_size": processes, "device": "cpu"},
    )


def _series(experiment: Experiment, ranks: int) -> None:
    rows = []

    def put(key: str, step: int, rank: int = 0) -> None:
        value = _value(key, step, rank)
        rows.append(
            SeriesPoint(experiment=experiment, key=key, step=step, time=step * 5.0, value=value)
        )

    epoch_steps = [STEPS * (e + 1) // EPOCHS for e in range(EPOCHS)]
    for step in range(1, STEPS + 1):
        for key in STEP_SERIES.values():
            put(key, step)
        put("machine/node-a/cpu_percent", step)
        for rank in range(ranks):
            for field in (*RANK_FIELDS, *PHASE_FIELDS, *ARRIVAL_FIELDS):
                put(f"rank/{rank}/{field}", step, rank)
        if step in epoch_steps:
            for key in EPOCH_SERIES.values():
                put(key, step)
            for rank in range(ranks):
                for field in MEMORY_FIELDS:
                    put(f"rank/{rank}/{field}", step, rank)
    SeriesPoint.objects.bulk_create(rows)
    LogLine.objects.bulk_create(
        LogLine(experiment=experiment, seq=i, time=i * 1.0, message=f"line {i}", rank=i % ranks)
        for i in range(20)
    )


def page_runs_make(owner: Any) -> dict[str, int]:
    """The DDP run, its baseline and their study: {"ddp": pk, "single": pk, "study": pk}."""
    ddp = _run(owner, "ddp pair", strategy="ddp", processes=2)
    single = _run(owner, "single baseline", strategy="single", processes=1)
    _series(ddp, 2)
    _series(single, 1)
    study = Study.objects.create(
        owner=owner,
        name="ddp against single",
        base={"model": "cnn", "dataset": "mnist", "epochs": EPOCHS},
        axes={"strategy": ["single", "ddp"], "seed": [0]},
        target_accuracy=0.9,
    )
    for position, (run, strategy) in enumerate(((single, "single"), (ddp, "ddp"))):
        StudyRun.objects.create(
            study=study, experiment=run, position=position, values={"strategy": strategy, "seed": 0}
        )
    return {"ddp": ddp.pk, "single": single.pk, "study": study.pk}
