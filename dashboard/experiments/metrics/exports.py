"""A run's series as files to take away: CSV, JSON, and TensorBoard event files in a zip.

Every raw point of every series goes out (the charts' buckets are for drawing, not for keeping).
Points are read from the database in chunks, so a 100,000-point run costs the memory of one
chunk: CSV and JSON are streamed as they are read, the TensorBoard files are written into a
temporary folder and zipped into an anonymous temporary file that is gone once it is sent.

The CSV is "long": one row per point, `key,step,time,value` (time in seconds since the run
started; an empty value where it was not finite). Series are taken at different steps (a test
point per epoch, a machine sample every few seconds), so a wide table would be mostly empty
cells; a spreadsheet's pivot table turns the long one into columns. POST
/api/experiments/import/ reads this file back as well as the wide `step,<series>...` form.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import re
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from dashboard.env import env_int
from dashboard.experiments.core.descriptions import experiment_option_values
from dashboard.experiments.models import Experiment, SeriesPoint

CSV_HEADER = ("key", "step", "time", "value")
# The run's launch fields travel in its TensorBoard log as one text summary (add_text writes it
# under "<tag>/text_summary"), so that an import of our own export gets them back; with their
# column sizes, which the import holds them to.
RUN_TAG = "trainyard/run"
RUN_TEXT_TAG = f"{RUN_TAG}/text_summary"
RUN_FIELDS = {"model": 200, "dataset": 100, "data_path": 1000}
# Beside them, how the run was spread: its strategy, processes and strategy options (what it
# trained with, null where the strategy does not read one), which an import takes back where the
# registry knows them (imports.run_launch_parse).
RUN_LAUNCH_FIELDS = ("strategy", "processes")
# Rows fetched from the database at a time, and characters gathered before a chunk is sent.
READ_CHUNK_ROWS = 2000
SEND_CHUNK_CHARS = 64 * 1024

Point = tuple[str, int, float, float | None]
CSV_JSON_ADVICE = "export the runs one at a time"
TENSORBOARD_ADVICE = "take the CSV (?format=csv), which is streamed, and convert it"


def export_max_points() -> int:
    """Points a CSV or JSON export may hold: they stream, but the request holds a database
    cursor and a server thread for as long as it sends."""
    return env_int("TRAINYARD_EXPORT_MAX_POINTS", 5_000_000)


def export_tensorboard_max_points() -> int:
    """Points a TensorBoard zip may hold: it is written whole in the request before a byte goes
    out (2 to 3 s per 20,000 points measured, against 0.06 s for the CSV), so 200,000 take
    half a minute and a larger one would hold the request for minutes."""
    return env_int("TRAINYARD_EXPORT_TENSORBOARD_MAX_POINTS", 200_000)


class ExportRefused(Exception):
    """The export would be too large to make in a request: 413, with the reason."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def export_size_check(*, experiments: Sequence[Experiment], tensorboard: bool) -> None:
    """ExportRefused where the runs hold more points than this kind of export may."""
    most = export_tensorboard_max_points() if tensorboard else export_max_points()
    # Counted up to one past the limit: a run of a billion points costs no more to refuse.
    points = SeriesPoint.objects.filter(experiment__in=list(experiments))
    if points[: most + 1].count() <= most:
        return
    kind, setting, advice = (
        ("a TensorBoard", "TRAINYARD_EXPORT_TENSORBOARD_MAX_POINTS", TENSORBOARD_ADVICE)
        if tensorboard
        else ("a CSV or JSON", "TRAINYARD_EXPORT_MAX_POINTS", CSV_JSON_ADVICE)
    )
    raise ExportRefused(
        f"the export holds over {most} points, the most {kind} export may hold "
        f"({setting}): {advice}"
    )


def export_points(*, experiment: Experiment, by_step: bool = False) -> Iterator[Point]:
    """(key, step, time, value) of every point, by key then step (or by step, as a training
    writes them), a chunk in memory at once."""
    order = ("step", "key", "id") if by_step else ("key", "step", "id")
    rows = (
        SeriesPoint.objects.filter(experiment=experiment)
        .order_by(*order)
        .values_list("key", "step", "time", "value")
    )
    return rows.iterator(chunk_size=READ_CHUNK_ROWS)


def export_filename(*, experiment: Experiment, suffix: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", experiment.name).strip("-.")[:60] or "run"
    return f"trainyard-{experiment.pk}-{slug}{suffix}"


def export_csv_chunks(*, experiment: Experiment) -> Iterator[str]:
    buffer = io.StringIO()
    # csv writes floats with repr(): the shortest text that reads back as the same number.
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for point in export_points(experiment=experiment):
        writer.writerow(point)
        if buffer.tell() >= SEND_CHUNK_CHARS:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def run_fields_of(experiment: Experiment) -> dict[str, Any]:
    return {
        **{name: getattr(experiment, name) for name in (*RUN_FIELDS, *RUN_LAUNCH_FIELDS)},
        **experiment_option_values(experiment=experiment),
    }


def _started(experiment: Experiment) -> datetime:
    # A run that never started has no start; its creation is the nearest instant.
    return experiment.started_at or experiment.created_at


def export_json_chunks(*, experiment: Experiment) -> Iterator[str]:
    """`{"id", "name", "started_at", "model", "dataset", "data_path", "strategy", "processes",
    <each strategy option>, "series": {key: [[step, time, value], ...]}}`: the shape of the
    metrics API's `?raw=1`, every point, written one series at a time."""
    started = _started(experiment).isoformat()
    head = {
        "id": experiment.pk,
        "name": experiment.name,
        "started_at": started,
        **run_fields_of(experiment),
    }
    yield json.dumps(head)[:-1] + ', "series": {'
    by_key = itertools.groupby(export_points(experiment=experiment), key=lambda p: p[0])
    for index, (key, points) in enumerate(by_key):
        yield ("" if index == 0 else ", ") + json.dumps(key) + ": ["
        separator = ""
        while chunk := list(itertools.islice(points, READ_CHUNK_ROWS)):
            yield separator + ", ".join(json.dumps([s, t, v]) for _, s, t, v in chunk)
            separator = ", "
        yield "]"
    yield "}}\n"


def _tensorboard_write(*, experiment: Experiment, folder: Path) -> None:
    # Imported here: TensorBoard and torch load in a second or two, which only exports need.
    from torch.utils.tensorboard import SummaryWriter

    started = _started(experiment).timestamp()
    writer = SummaryWriter(log_dir=str(folder), max_queue=1000, flush_secs=3600)
    try:
        writer.add_text(RUN_TAG, json.dumps(run_fields_of(experiment)), global_step=0)
        # By step across tags, as a training writes them: TensorBoard reports a step that goes
        # back in one file as out of order (and older readers purge what follows it).
        for key, step, time, value in export_points(experiment=experiment, by_step=True):
            scalar = math.nan if value is None else value
            writer.add_scalar(key, scalar, global_step=step, walltime=started + time)
    finally:
        writer.close()


def export_tensorboard_zip(*, experiments: Sequence[Experiment]) -> IO[bytes]:
    """A zip of TensorBoard log folders, one per run and named after it: every series a scalar
    tag, the step as the step, started_at + time as the wall time. Unzip and `tensorboard
    --logdir .`: with several runs, TensorBoard overlays them.

    TensorBoard keeps scalars as 32-bit floats; a value that was not finite (stored as null)
    is written as NaN so that every point is there. Returns an open anonymous temporary file,
    at its start, which its reader closes (and so removes)."""
    with tempfile.TemporaryDirectory(prefix="trainyard-export-") as tmp:
        for experiment in experiments:
            folder = Path(tmp) / export_filename(experiment=experiment, suffix="")
            _tensorboard_write(experiment=experiment, folder=folder)
        # Not a `with`: the caller sends it and closes it, which removes it.
        archive = tempfile.TemporaryFile(prefix="trainyard-export-", suffix=".zip")  # noqa: SIM115
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
            for path in sorted(Path(tmp).rglob("*")):
                if path.is_file():
                    zipped.write(path, arcname=path.relative_to(tmp).as_posix())
    archive.seek(0)
    return archive
