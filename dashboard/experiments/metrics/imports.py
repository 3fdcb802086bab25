"""Runs brought in from elsewhere: a TensorBoard log or a CSV becomes a finished run.

As Aim's `aim convert tensorboard` and `wandb sync` do, so that people can overlay the curves of
their own scripts on the dashboard's runs. The upload is one of:

- one TensorBoard event file (`events.out.tfevents...`), read with TensorBoard's own
  EventAccumulator; scalars written the old way (`simple_value`) and the new way (a tensor with
  the scalars plugin, as TF2 and `add_scalar(new_style=True)` write) are both read;
- a zip or a tar (gzip, bzip2, xz) of a log folder; where event files sit in several folders,
  each folder's tags get its path below the common one as a prefix (`run2/train_loss`);
- a CSV whose first column is `step` and whose other columns are series (an empty cell: no
  point); a column named `time` gives the row's seconds since the start. The long
  `key,step,time,value` CSV of the export is read too, and so is the `Wall time,Step,Value` CSV
  that TensorBoard's own page downloads for one chart (`run-<run>-tag-<tag>.csv`).

Every scalar tag becomes a series under its own name, so `train_loss` or `test_accuracy` land
on the run page's charts. TensorBoard's wall times become `time` relative to the first one.
Nothing is stored unless the whole file reads: one transaction, after the file is read.
Limits (bytes of the upload, bytes unpacked from an archive, points, series, points of a series
at one step, and so a CSV line's length) come from the environment.
Archives are unpacked, within their own bounds, by archives.py.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import json
import math
import os
import struct
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone

from dashboard.env import env_int
from dashboard.experiments.core.archives import ImportRefused, tar_unpack, zip_unpack
from dashboard.experiments.core.bounded import bounded_call
from dashboard.experiments.core.forms import LIMITS
from dashboard.experiments.metrics.exports import RUN_FIELDS, RUN_TEXT_TAG
from dashboard.experiments.metrics.series import MAX_KEY_CHARS, MAX_STEP
from dashboard.experiments.models import Experiment, SeriesPoint, Status, Strategy
from dashboard.text_input import text_fault
from training.catalogue import IMAGEFOLDER
from training.registry import STRATEGIES

MAX_NAME_CHARS = Experiment._meta.get_field("name").max_length or 200
WRITE_BATCH = 5000
RECORD_HEADER_BYTES = 12  # a TFRecord's length and its CRC
RUN_EVENTS_LOOKED_AT = 4  # the file's version, then our export's text summary first
LONG_CSV_HEADER = ["key", "step", "time", "value"]
TENSORBOARD_CSV_HEADER = ["wall time", "step", "value"]
ACCEPTED = (
    "send a TensorBoard event file, a zip or tar.gz of a log folder, "
    "or a CSV whose first column is step"
)
# EventAccumulator keeps a random sample of 10,000 scalars a tag unless told 0 (= all); tensors
# reach it only where they are scalars (_scalar_accumulator), and the rest is never kept.
SIZE_GUIDANCE = {
    "scalars": 0,
    "tensors": 0,
    "images": 1,
    "audio": 1,
    "histograms": 1,
    "compressedHistograms": 1,
}


def import_max_bytes() -> int:
    return env_int("TRAINYARD_IMPORT_MAX_BYTES", 50 * 1024 * 1024)


def import_max_points() -> int:
    return env_int("TRAINYARD_IMPORT_MAX_POINTS", 2_000_000)


def import_max_series() -> int:
    """Series an imported run may have: the run's readers (snapshot, metrics, raw pages) go
    through its series, bounded for a trained run by what its engine reports."""
    return env_int("TRAINYARD_IMPORT_MAX_SERIES", 1000)


def import_max_points_per_step() -> int:
    """Points one series may have at one step (a log restarted may repeat a few steps): the
    readers take a step's points together."""
    return env_int("TRAINYARD_IMPORT_MAX_POINTS_PER_STEP", 16)


def import_max_record_bytes() -> int:
    """A TensorBoard record's most bytes: a record is parsed whole, into about 9 times its
    bytes (a 10 MB record of a million values took 92 MB), where a scalar's takes ~50 bytes and
    an image's a few hundred KB."""
    return env_int("TRAINYARD_IMPORT_MAX_RECORD_BYTES", 8 * 1024 * 1024)


def _csv_max_line_chars() -> int:
    """A CSV line's most characters: a header of the most series, each of the longest name,
    quoted; a line is read no further, so a file of one long line costs no more."""
    return (import_max_series() + 3) * (MAX_KEY_CHARS + 3)


@dataclass
class ImportedSeries:
    """What a file held: per key, (step, seconds since the start, value) in file order; `start`
    is the first wall time where the file had wall times."""

    points: dict[str, list[tuple[int, float, float | None]]] = field(default_factory=dict)
    start: float | None = None
    count: int = 0
    # model, dataset, data_path, strategy, processes and options as our TensorBoard export
    # wrote them (empty from elsewhere)
    run_fields: dict[str, Any] = field(default_factory=dict)
    max_series: int = field(default_factory=import_max_series)

    def add(self, key: str, step: int, time: float, value: float | None) -> None:
        if not key or len(key) > MAX_KEY_CHARS:
            raise ImportRefused(400, f"series name {key[:80]!r} is empty or over 200 characters")
        if why := text_fault(key):
            raise ImportRefused(400, f"series name {key[:80]!r} {why}")
        if not 0 <= step <= MAX_STEP:
            raise ImportRefused(400, f"series {key!r}: step {step} is not in 0..{MAX_STEP}")
        self.count += 1
        if self.count > import_max_points():
            raise ImportRefused(413, f"the file holds over {import_max_points()} points")
        if key not in self.points and len(self.points) >= self.max_series:
            raise ImportRefused(400, f"the file holds over {self.max_series} series")
        finite = value is not None and math.isfinite(value)
        self.points.setdefault(key, []).append((step, time, value if finite else None))

    def steps_check(self) -> None:
        """Refuse a series with over import_max_points_per_step() points at one step; checked
        once all is read (the points bound has bounded the work), one series at a time."""
        most = import_max_points_per_step()
        for key, points in self.points.items():
            step, count = Counter(step for step, _, _ in points).most_common(1)[0]
            if count > most:
                raise ImportRefused(
                    400,
                    f"series {key[:80]!r} has {count} points at step {step}, over the {most} "
                    "a series may have at one step",
                )


@dataclass
class PackedSeries:
    """ImportedSeries as the bounded child sends it back: per key, its steps, times and values
    (NaN: none) as arrays, 24 bytes a point where a list of tuples takes about 130, so that the
    web server holds at most import_max_points() * 24 bytes of an import's points."""

    kind: str
    start: float | None
    count: int
    run_fields: dict[str, Any]
    series: dict[str, tuple[array, array, array]]

    @classmethod
    def of(cls, found: ImportedSeries, kind: str) -> PackedSeries:
        series = {}
        for key in list(found.points):
            points = found.points.pop(key)  # freed as it is packed
            series[key] = (
                array("q", (step for step, _, _ in points)),
                array("d", (time for _, time, _ in points)),
                array("d", (math.nan if value is None else value for _, _, value in points)),
            )
        return cls(kind, found.start, found.count, found.run_fields, series)

    def last(self, key: str) -> float | None:
        """The series' last value, where it has one."""
        values = self.series[key][2] if key in self.series else array("d")
        return next((v for v in reversed(values) if not math.isnan(v)), None)

    def rows(self, experiment: Experiment) -> Iterator[SeriesPoint]:
        for key, (steps, times, values) in self.series.items():
            for step, time, value in zip(steps, times, values, strict=True):
                stored = None if math.isnan(value) else value
                yield SeriesPoint(
                    experiment=experiment, key=key, step=step, time=time, value=stored
                )


def _number(text: str, where: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise ImportRefused(400, f"{where}: {text[:40]!r} is not a number") from None
    return value if math.isfinite(value) else None


def _step(text: str, where: str) -> int:
    value = _number(text, where)
    if value is None or value != int(value):
        raise ImportRefused(400, f"{where}: step {text[:40]!r} is not a whole number")
    return int(value)


def _cells_check(row: list[str], expected: int, line: int) -> None:
    if len(row) != expected:
        raise ImportRefused(400, f"CSV line {line}: {len(row)} cells, the header has {expected}")


def _csv_lines(source: IO[str]) -> Iterator[str]:
    """The file's lines, each read no further than _csv_max_line_chars(): csv.reader splits a
    whole line into cells before any check sees it."""
    most = _csv_max_line_chars()
    for number in itertools.count(1):
        line = source.readline(most + 1)
        if not line:
            return
        if len(line) > most:
            raise ImportRefused(400, f"CSV line {number} is over {most} characters")
        yield line


def csv_read(*, source: IO[str], filename: str = "") -> ImportedSeries:
    rows = csv.reader(_csv_lines(source))
    header = [cell.strip() for cell in next(rows, [])]
    if len(header) > import_max_series() + 2:  # step, time and the series
        raise ImportRefused(400, f"the CSV has over {import_max_series()} series columns")
    if header == LONG_CSV_HEADER:
        return _csv_long_read(rows)
    if [cell.lower() for cell in header] == TENSORBOARD_CSV_HEADER:
        return _csv_tensorboard_read(rows, filename)
    if not header or header[0].lower() != "step":
        raise ImportRefused(400, "a CSV's first column must be `step` (or key,step,time,value)")
    names = header[1:]
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        raise ImportRefused(400, "the CSV's columns after `step` need distinct, non-empty names")
    time_at = names.index("time") + 1 if "time" in names else None
    found = ImportedSeries()
    for line, row in enumerate(rows, start=2):
        if not any(cell.strip() for cell in row):
            continue
        _cells_check(row, len(header), line)
        step = _step(row[0], f"CSV line {line}")
        time = _number(row[time_at], f"CSV line {line}, time") if time_at else 0.0
        for column, cell in enumerate(row[1:], start=1):
            if column != time_at and cell.strip():
                value = _number(cell, f"CSV line {line}, column {header[column]}")
                found.add(header[column], step, time or 0.0, value)
    return found


def _csv_long_read(rows: Iterator[list[str]]) -> ImportedSeries:
    found = ImportedSeries()
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        _cells_check(row, len(LONG_CSV_HEADER), line)
        where = f"CSV line {line}"
        value = _number(row[3], where) if row[3].strip() else None
        found.add(row[0], _step(row[1], where), _number(row[2], where) or 0.0, value)
    return found


def _csv_tensorboard_read(rows: Iterator[list[str]], filename: str) -> ImportedSeries:
    """TensorBoard's own "download CSV" of one chart (`Wall time,Step,Value`), which it names
    run-<run>-tag-<tag>.csv: the tag after "-tag-" names the series; wall times become `time`
    relative to the first."""
    stem = PurePosixPath(filename).stem
    key = stem.rpartition("-tag-")[2] or "value"
    points: list[tuple[int, float, float | None]] = []
    for line, row in enumerate(rows, start=2):
        if row:
            _cells_check(row, len(TENSORBOARD_CSV_HEADER), line)
            where = f"CSV line {line}"
            wall = _number(row[0], where) or 0.0
            points.append((_step(row[1], where), wall, _number(row[2], where)))
    start = min((wall for _, wall, _ in points), default=None)
    found = ImportedSeries(start=start)
    for step, wall, value in points:
        found.add(key, step, wall - (start or 0.0), value)
    return found


def _tensor_values_check(tag: str, tensor: Any) -> None:
    """Refuse a scalars-plugin tensor that is not one value, by the shape it declares and before
    any array is made: TensorBoard's make_ndarray repeats a single value to the declared shape
    (np.repeat), so a file under 1 KB declaring [2**31] would ask for gigabytes."""
    declared = 1
    for dim in tensor.tensor_shape.dim:
        if dim.size < 0:
            raise ImportRefused(400, f"series {tag[:80]!r}: a tensor of unknown shape")
        declared *= dim.size
    if declared != 1:
        raise ImportRefused(
            400, f"series {tag[:80]!r}: a tensor that declares {declared} values; a scalar has one"
        )


def _tensor_scalar(tag: str, event: Any) -> float:
    """The one value of a scalar tensor, its shape checked as it was read
    (_tensor_values_check); one the reader cannot make a float of is refused in its words."""
    from tensorboard.util import tensor_util

    try:
        return float(tensor_util.make_ndarray(event.tensor_proto).reshape(-1)[0])
    except (TypeError, ValueError, IndexError) as exc:
        raise ImportRefused(400, f"series {tag[:80]!r}: not a number ({exc})"[:300]) from None


Scalar = tuple[int, float, float]  # step, wall time, value


@dataclass
class _PointBudget:
    """Points an import may still take, counted as the event files are read: a log of
    millions of scalars is refused at the first point past the limit, not once it is all in
    memory."""

    left: int = field(default_factory=import_max_points)

    def take(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise ImportRefused(413, f"the file holds over {import_max_points()} points")


@functools.cache
def _scalar_accumulator() -> type[Any]:
    """EventAccumulator keeping scalars only, counted against a budget: images, audio,
    histograms and non-scalar tensors (TF2 writes images and histograms as tensors) are
    dropped as they are read. Made on first use: TensorBoard takes a second to import, which
    only imports need."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class ScalarAccumulator(EventAccumulator):
        def __init__(self, path: str, budget: _PointBudget):
            super().__init__(path, size_guidance=SIZE_GUIDANCE)
            self.budget = budget

        def _ProcessScalar(self, tag: str, wall_time: float, step: int, scalar: Any) -> None:  # noqa: N802
            self.budget.take()
            super()._ProcessScalar(tag, wall_time, step, scalar)

        def _ProcessTensor(self, tag: str, wall_time: float, step: int, tensor: Any) -> None:  # noqa: N802
            # The tag's metadata is stored before its first value is processed.
            metadata = self.summary_metadata.get(tag)
            if metadata is not None and metadata.plugin_data.plugin_name == "scalars":
                _tensor_values_check(tag, tensor)
                self.budget.take()
                super()._ProcessTensor(tag, wall_time, step, tensor)

        def _ProcessHistogram(self, *args: Any) -> None:  # noqa: N802
            return None

        def _ProcessImage(self, *args: Any) -> None:  # noqa: N802
            return None

        def _ProcessAudio(self, *args: Any) -> None:  # noqa: N802
            return None

    return ScalarAccumulator


def _folder_scalars(folder: Path, budget: _PointBudget) -> dict[str, list[Scalar]]:
    """(step, wall time, value) per scalar tag of the event files in one folder."""
    accumulator = _scalar_accumulator()(str(folder), budget)
    try:
        accumulator.Reload()
    except ImportRefused:
        raise
    except Exception as exc:  # its readers raise their own kinds (DataLossError, protobuf's)
        raise ImportRefused(400, f"not a readable TensorBoard event file: {exc}"[:300]) from None
    tags = accumulator.Tags()
    found = {
        tag: [(e.step, e.wall_time, e.value) for e in accumulator.Scalars(tag)]
        for tag in tags["scalars"]
    }
    for tag in tags.get("tensors", []):
        events = accumulator.Tensors(tag)
        found[tag] = [(e.step, e.wall_time, _tensor_scalar(tag, e)) for e in events]
    return found


def _event_records_check(path: Path) -> None:
    """Refuse an event file holding a record over import_max_record_bytes(), by the length in
    each record's header, before TensorBoard's reader parses any (TFRecord: an 8-byte length,
    its 4-byte CRC, the data, the data's 4-byte CRC). What is not a whole record is left to the
    reader, whose refusal says so."""
    most, size = import_max_record_bytes(), path.stat().st_size
    with path.open("rb") as source:
        while len(header := source.read(RECORD_HEADER_BYTES)) == RECORD_HEADER_BYTES:
            (length,) = struct.unpack("<Q", header[:8])
            if length > size - source.tell():
                return  # not a record (or one cut short): the reader reads to the end, no more
            if length > most:
                raise ImportRefused(
                    400, f"{path.name[:120]}: a record of {length} bytes, over {most} bytes"
                )
            source.seek(length + 4, io.SEEK_CUR)


def tensorboard_read(*, files: Iterable[Path]) -> ImportedSeries:
    files = list(files)
    for path in files:
        _event_records_check(path)
    folders = sorted({path.parent for path in files})
    if not folders:
        raise ImportRefused(400, f"no TensorBoard event file (events.out.tfevents...); {ACCEPTED}")
    # One folder: tags as they are. Several (one per run or per add_scalars group): each
    # folder's tags prefixed by its path below their common folder.
    common = Path(os.path.commonpath(folders))
    by_tag: dict[str, list[Scalar]] = {}
    budget = _PointBudget()
    for folder in folders:
        prefix = folder.relative_to(common).as_posix() if len(folders) > 1 else "."
        for tag, events in _folder_scalars(folder, budget).items():
            if events:
                by_tag[tag if prefix == "." else f"{prefix}/{tag}"] = events
    if not by_tag:
        raise ImportRefused(400, f"the TensorBoard log holds no scalar series; {ACCEPTED}")
    start = min(wall for events in by_tag.values() for _, wall, _ in events)
    found = ImportedSeries(start=start, run_fields=run_fields_read(files=files))
    for tag, events in by_tag.items():
        for step, wall, value in events:
            found.add(tag, step, wall - start, value)
    return found


def _kind(head: bytes, filename: str) -> str:
    if head.startswith(b"PK"):
        return "zip"
    tar_magic = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")
    if head.startswith(tar_magic) or head[257:262] == b"ustar":
        return "tar"
    text = head.lstrip(b"\xef\xbb\xbf").lower()
    if filename.lower().endswith(".csv") or text.startswith((b"step", b"key,", b"wall time,")):
        return "csv"
    return "tensorboard"


def import_read(*, upload: UploadedFile, folder: Path) -> PackedSeries:
    """The series in an uploaded file and what kind of file it was, checked (points, series,
    points at one step); `folder` is scratch room. The web server only saves the upload: a
    bounded child reads it (core/bounded.py)."""
    saved = folder / "upload" / "events.out.tfevents.upload"
    saved.parent.mkdir()
    with saved.open("wb") as out:
        for chunk in upload.chunks():
            out.write(chunk)
    return bounded_call(saved_packed, saved, upload.name or "", folder)


def saved_packed(saved: Path, filename: str, folder: Path) -> PackedSeries:
    """import_read's work in the bounded child: the saved upload read and checked."""
    found, kind = saved_read(saved, filename, folder)
    if not found.count:
        raise ImportRefused(400, "the file holds no points")
    found.steps_check()
    return PackedSeries.of(found, kind)


def saved_read(saved: Path, filename: str, folder: Path) -> tuple[ImportedSeries, str]:
    """The series in the saved upload and what kind of file it was."""
    with saved.open("rb") as source:
        kind = _kind(source.read(512), filename)
        source.seek(0)
        if kind == "zip":
            return tensorboard_read(files=zip_unpack(source=source, root=folder / "log")), kind
        if kind == "tar":
            return tensorboard_read(files=tar_unpack(source=source, root=folder / "log")), kind
    if kind == "csv":
        try:
            with saved.open(encoding="utf-8-sig", newline="") as text:
                return csv_read(source=text, filename=filename), kind
        except UnicodeDecodeError:
            raise ImportRefused(400, "the CSV is not UTF-8 text") from None
    return tensorboard_read(files=[saved]), "TensorBoard event file"


def run_fields_read(*, files: Iterable[Path]) -> dict[str, Any]:
    """The launch fields our export wrote as the first summary of its event file (exports.py
    RUN_TAG); only the first events of each file are looked at, so a log from elsewhere costs
    nothing. Empty where no file has them."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    for path in sorted(files):
        try:
            for event in itertools.islice(EventFileLoader(str(path)).Load(), RUN_EVENTS_LOOKED_AT):
                for value in event.summary.value:
                    if value.tag == RUN_TEXT_TAG and value.tensor.string_val:
                        return run_fields_parse(
                            value.tensor.string_val[0].decode("utf-8", "replace")
                        )
        except Exception:  # an unreadable file is the scalar reader's to refuse, in its words
            continue
    return {}


def run_fields_parse(text: str) -> dict[str, Any]:
    """The launch fields our export wrote (exports.run_fields_of): those of RUN_FIELDS that
    are strings of a sane length, and the run's strategy, processes and options where they make
    sense together (run_launch_parse); anything else in the text is ignored."""
    try:
        raw = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        **{
            key: raw[key]
            for key, most in RUN_FIELDS.items()
            if isinstance(raw.get(key), str) and len(raw[key]) <= most and not text_fault(raw[key])
        },
        **run_launch_parse(raw),
    }


def run_launch_parse(raw: dict[str, Any]) -> dict[str, Any]:
    """The strategy, processes and strategy options our export wrote: a strategy the registry
    knows, processes within the form's bounds (1 for a one-process strategy), and each option
    that strategy reads with one of its values, typed as they are. Empty otherwise: the run is
    then a single-device one, as a log from elsewhere."""
    name, processes, (low, high) = raw.get("strategy"), raw.get("processes"), LIMITS["processes"]
    spec = STRATEGIES.get(name) if isinstance(name, str) else None
    if spec is None or type(processes) is not int or not low <= processes <= high:
        return {}
    fields: dict[str, Any] = {
        "strategy": spec.name,
        "processes": processes if spec.processes else 1,
    }
    for option in spec.options:
        value = raw.get(option.name)
        if type(value) is type(option.default) and value in option.values:
            fields[option.name] = value
    return fields


def experiment_import(
    *, owner: Any, upload: UploadedFile, name: str = "", fields: dict[str, str] | None = None
) -> Experiment:
    """A finished run of `owner` holding every series of the upload, or ImportRefused (and
    nothing stored). Its model, dataset and data path: `fields` (the request's), else what our
    own TensorBoard export wrote, else the defaults; its strategy, processes and strategy
    options: what our own export wrote, else one device (single)."""
    if upload.size is not None and upload.size > import_max_bytes():
        raise ImportRefused(413, f"the file is {upload.size} bytes, over {import_max_bytes()}")
    with tempfile.TemporaryDirectory(prefix="trainyard-import-") as scratch:
        found = import_read(upload=upload, folder=Path(scratch))
    # Only the notes say it; a character no column stores is dropped rather than refused.
    filename = "".join(c for c in PurePosixPath(upload.name or "upload").name if not text_fault(c))
    started = datetime.fromtimestamp(found.start, tz=UTC) if found.start else timezone.now()
    last_time = max(max(times) for _, times, _ in found.series.values())
    given = run_fields_parse(json.dumps(fields or {}))
    launch = {**found.run_fields, **{key: value for key, value in given.items() if value}}
    if launch.get("dataset") != IMAGEFOLDER:  # a path means something to an image folder only
        launch.pop("data_path", None)
    with transaction.atomic():
        experiment = Experiment.objects.create(
            owner=owner,
            # One device, unless our own export said how the run was spread.
            **{"strategy": Strategy.SINGLE, "processes": 1, **launch},
            name=(name.strip() or filename.split(".")[0] or "imported run")[:MAX_NAME_CHARS],
            status=Status.SUCCEEDED,
            started_at=started,
            finished_at=started + timedelta(seconds=max(0.0, last_time)),
            step=max(max(steps) for steps, _, _ in found.series.values()),
            test_loss=found.last("test_loss"),
            test_accuracy=found.last("test_accuracy"),
            imported=True,
            notes=[
                f"Imported from {filename[:120]} ({found.kind}): {len(found.series)} series, "
                f"{found.count} points. No worker trained it here."
            ],
        )
        rows = found.rows(experiment)
        while batch := list(itertools.islice(rows, WRITE_BATCH)):
            SeriesPoint.objects.bulk_create(batch)
    return experiment
