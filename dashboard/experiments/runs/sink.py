"""Where a run's events go: metric and log rows in the database, then the run's channel group.

Events are numbered by the dashboard (`seq`, per experiment, no gaps), stored in one transaction
per flush, and sent as one channel message per flush: channels-redis drops messages past its
capacity without a word, so a fast run must not send one message per event. The supervisor
flushes as soon as `due_in` says so: at once when events are sparse (a point leaves the moment it
comes), at most once per `SEND_GAP_SECONDS` under load (a burst is coalesced into one message and
one transaction). What it takes (a training event, or a body of the dashboard's own) and what the
page receives are typed in `messages.py`.

Every figure of a step or epoch event is stored as a series (`SeriesPoint`, keys as listed in
`series.py`'s contract): the step's train_loss, images_per_second, lr and rank 0's data/compute
seconds and rss; each rank's figures from `ranks` as rank/<r>/... (its phases and bytes sent
too, protocol 1.9); the epoch's test_loss and
test_accuracy, its mean images/s as epoch/images_per_second (a coarser figure over a whole
epoch: scaling.py reads it only for a run with no step event), and what each rank holds (its
`memory`, protocol 1.7) as rank/<r>/parameter_bytes and the like, the last epoch's also on the
row (`Experiment.memory`, the read JSON's). A language model's (protocol 1.15): tokens/s (each
rank's too), MFU and the gradient norm of a step; bits per byte, perplexity, tokens/s and MFU of
an evaluation, its bits per byte and MFU also on the row, as its test loss, and the text the
model wrote there among the row's latest few (`Experiment.samples`); each step and epoch
message then carries the run's tokens/s and MFU so far (`language`, metrics/language.py).
The supervisor's machine samples come through `add_series`. A user's script reports its own
figures in `metrics` events (protocol 1.11), one rank's at its step: stored as rank/<r>/<name>,
rank 0's also as <name>, and sent to the page as a `series` message, the shape its charts
already take. A script run's launcher says when its ranks stall and step again (`stalled`,
protocol 1.13): the row takes it at once (stalls.py), the log a line, and the page a `stalled`
message.

The sink is the unit of work (add, due, flush, numbering under the row lock), and that only:
a flush says whether it stored windows of several ranks' phases (`PhasesStored`), and whoever
flushes reads the stored series for a straggler after the commit (stragglers.py's
`events_flush`). The bounds it reads fields within are bounds.py's, checkpoint rows and
retention retention.py's, the channel send broadcast.py's.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from channels.layers import get_channel_layer
from django.db import transaction

from dashboard.experiments.core.memory import memory_rows, model_bytes_of
from dashboard.experiments.core.messages import (
    Body,
    LogBody,
    Message,
    RankRow,
    RankStats,
    SeriesBody,
)
from dashboard.experiments.core.profiles import profile_as_dict
from dashboard.experiments.core.run_facts import checkpoint_texts, rank_rows, started_texts
from dashboard.experiments.core.stalls import STALLED_UNREAD
from dashboard.experiments.metrics.language import (
    language_figures,
    sample_clean,
    samples_with,
)
from dashboard.experiments.metrics.series import MAX_KEY_CHARS, MAX_STEP
from dashboard.experiments.metrics.series_contract import (
    ARRIVAL_FIELDS,
    EPOCH_SERIES,
    LANGUAGE_RANK_FIELDS,
    MEMORY_FIELDS,
    PHASE_FIELDS,
    RANK_FIELDS,
    STEP_SERIES,
)
from dashboard.experiments.metrics.throughput import (
    EPOCH_TOKENS_KEY,
    TOKENS_KEY,
    Throughput,
    rank_stats_so_far,
    run_figure,
    run_throughput_read,
)
from dashboard.experiments.models import Experiment, LogLine, SeriesPoint
from dashboard.experiments.runs.bounds import is_count, number_or_none
from dashboard.experiments.runs.broadcast import checkpoint_saved_text, events_broadcast
from dashboard.experiments.runs.profiles import profile_event_store
from dashboard.experiments.runs.retention import CheckpointsPending, checkpoint_row
from dashboard.experiments.runs.stalls import stalled_body, stalled_change, stalled_read
from training.protocol import Event

log = logging.getLogger(__name__)

# Under load, one channel message (and one transaction) per this many seconds at most: 20 a
# second, whatever the training writes. channels-redis holds 1000 per channel (settings.py) and
# drops them after 30 s, so a consumer that stops reading has at most 600 queued: within it.
SEND_GAP_SECONDS = 0.05
MAX_LOG_CHARS = 4000
# A report is trusted to be small, not to be well-formed: bound what one event can store.
MAX_RANKS = 1024
MAX_METRICS_VALUES = 256  # a script's figures in one `metrics` event
# The keys the dashboard files by rank and by machine: a script's name there would pose as
# another rank's figure (rank/3/loss from rank 0) or a machine's sample, so it is skipped. A name
# the engine also writes (train_loss, lr) is the script's to use, and meant to be: a script run
# has no engine writing them, and the charts that draw them then draw the script's.
RESERVED_PREFIXES = ("rank/", "machine/")
# The row's figures of an evaluation: its field, and the series it is stored under
# (EPOCH_SERIES); a language model's too (protocol 1.15).
EVALUATED_FIELDS = {
    "test_loss": "test_loss",
    "test_accuracy": "test_accuracy",
    "bits_per_byte": "bits_per_byte",
    "mfu": "epoch/mfu",
}


def output_body(line: str, *, level: str, rank: int | None = None, machine: str = "") -> LogBody:
    """A line of plain output (stderr, or stdout that is not an event); ``rank`` where a
    training log line said which rank wrote it, ``machine`` where several machines run."""
    body: LogBody = {"type": "log", "level": level, "message": line.rstrip()[:MAX_LOG_CHARS]}
    if rank is not None:
        body["rank"] = rank
    if machine:
        body["machine"] = machine
    return body


def rank_stats_from_event(message: dict[str, Any]) -> RankStats | None:
    """The per-rank figures of a step or epoch event (protocol 1.1), or None when it has none.

    Events from one-process strategies may carry rank 0's figures only (data_seconds, ...)
    without `ranks`: those become a one-rank list, so the page has one shape to draw.
    """
    ranks = message.get("ranks")
    if not isinstance(ranks, list):
        if all(number_or_none(message.get(name)) is None for name in RANK_FIELDS[1:]):
            return None
        ranks = [{"rank": 0, **{name: message.get(name) for name in RANK_FIELDS}}]
    rows: list[RankRow] = []
    for index, rank in enumerate(ranks[:MAX_RANKS]):
        if not isinstance(rank, dict):
            continue
        number = rank.get("rank")
        if not isinstance(number, int) or isinstance(number, bool):
            number = index
        figures = {name: number_or_none(rank.get(name)) for name in RANK_FIELDS}
        row = cast(RankRow, {"rank": number, **figures})
        if isinstance(machine := rank.get("machine"), str) and machine:
            row["machine"] = machine[:255]  # tagged by the relay (relay.py), several machines
        rows.append(row)
    if not rows:
        return None
    return {
        "type": message["type"],
        "step": message.get("step"),
        "epoch": message.get("epoch"),
        "time": number_or_none(message.get("time")),
        "ranks": rows,
    }


def _rank_series(
    ranks: Any, *, fields: tuple[str, ...], given: bool = False
) -> dict[str, float | None]:
    """rank/<r>/<field> for each rank's figures: a step event's `ranks` (protocol 1.1), an
    epoch event's `memory` (1.7); ``given``: only the fields a rank's entry has (the phases of
    1.9, which an older run never reported)."""
    if not isinstance(ranks, list):
        return {}
    values: dict[str, float | None] = {}
    for row in ranks[:MAX_RANKS]:
        number = row.get("rank") if isinstance(row, dict) else None
        if is_count(number):
            values.update(
                {
                    f"rank/{number}/{name}": number_or_none(row.get(name))
                    for name in fields
                    if not given or name in row
                }
            )
    return values


@dataclass(frozen=True)
class PhasesStored:
    """What a flush stored of several ranks' phases: the run's latest step and the training's
    time of the latest such window, where the straggler rule places what it says."""

    step: int
    time: float


def event_series(message: dict[str, Any]) -> dict[str, float | None]:
    """A step or epoch event's series, its memory's aside: the contract's fields it has, and a
    step's per-rank figures and phases (rank/<r>/...)."""
    fields = STEP_SERIES if message["type"] == "step" else EPOCH_SERIES
    values = {
        key: number_or_none(message.get(name)) for name, key in fields.items() if name in message
    }
    if message["type"] == "step":
        values.update(_rank_series(message.get("ranks"), fields=RANK_FIELDS))
        values.update(_rank_series(message.get("ranks"), fields=PHASE_FIELDS, given=True))
        values.update(_rank_series(message.get("ranks"), fields=ARRIVAL_FIELDS, given=True))
        values.update(_rank_series(message.get("ranks"), fields=LANGUAGE_RANK_FIELDS, given=True))
    return values


def metrics_series(message: dict[str, Any]) -> dict[str, float | None]:
    """A script's `metrics` event (protocol 1.11) as series: rank/<r>/<name> for its rank, and
    <name> for rank 0's (the engine's convention). Within bounds: a rank below MAX_RANKS, the
    first MAX_METRICS_VALUES figures, names whose keys fit the column; the rest is skipped."""
    rank, values = message.get("rank"), message.get("values")
    if not is_count(rank) or cast(int, rank) >= MAX_RANKS or not isinstance(values, dict):
        return {}
    series: dict[str, float | None] = {}
    for name, value in list(values.items())[:MAX_METRICS_VALUES]:
        key = f"rank/{rank}/{name}"
        if not name or len(key) > MAX_KEY_CHARS or name.startswith(RESERVED_PREFIXES):
            continue  # (JSON's names are strings: the relay parsed it)
        series[key] = number_or_none(value)
        if rank == 0:
            series[name] = series[key]
    return series


def log_row(message: dict[str, Any], *, experiment_id: int, seq: int, level: str) -> LogLine:
    """The log's row of a line the sink numbered `seq`, its fields bounded."""
    return LogLine(
        experiment_id=experiment_id,
        seq=seq,
        time=number_or_none(message.get("time")) or 0.0,
        level=level[:16],
        message=str(message.get("message", ""))[:MAX_LOG_CHARS],
        rank=rank if is_count(rank := message.get("rank")) else None,
        machine=str(message.get("machine") or "")[:255],
    )


def evaluated_figures(values: Mapping[str, float | None]) -> dict[str, float]:
    """The row's test figures an epoch's evaluation gives (its series' values, none where it
    did not evaluate): kept on the row as they come, so that a run stopped or lost after an
    evaluation still shows it, on its page and in the list, as its charts do."""
    found = {field: values.get(key) for field, key in EVALUATED_FIELDS.items()}
    return {field: value for field, value in found.items() if value is not None}


# Two of the stores of EVENT_STORES below, outside the class to keep it to the unit of work.


def _metrics_store(sink: EventSink, message: dict[str, Any]) -> None:
    """A script's figures, stored as series at its step. Rank 0's moves the row's step, as a
    step event does, until a step event comes: the observer's count of optimizer steps is then
    the row's, not the script's own numbering, which may differ. The message becomes a
    `series` one (add_series' shape), which the page's charts take; an event out of bounds
    stores nothing and sends no points."""
    step, rank = cast(int, message.get("step")), message.get("rank")
    time_ = number_or_none(message.get("time")) or 0.0
    values = metrics_series(message) if is_count(step) and step <= MAX_STEP else {}
    seq = message["seq"]
    message.clear()
    message.update(type="series", seq=seq, points={})
    if not values:
        return
    sink._add_values(values, step=step, time_=time_)
    message["points"] = {key: [[step, time_, v]] for key, v in values.items()}
    if rank == 0 and not sink.stepped:
        sink.step = sink.updates["step"] = step


def _stalled_store(sink: EventSink, message: dict[str, Any]) -> None:
    """The launcher's word that the ranks stalled, or step again (protocol 1.13), recorded on
    the row at once, as a profile's is: a rare event, and the row is what the read JSON and a
    reloaded page show. The message becomes the page's `stalled` one, with the log's line;
    where the row did not change (the attempt ended, the stall was cleared already), it says
    `stalled` null and no line. One the dashboard cannot read is a warning line, nothing more."""
    said = stalled_read(message)
    time_ = number_or_none(message.get("time")) or 0.0
    seq = message["seq"]
    message.clear()
    if said is None:
        message.update(type="log", seq=seq, level="warning", message=STALLED_UNREAD, time=time_)
        sink._add_log(message, level="warning")
        return
    change = stalled_change(experiment=sink.experiment, said=said)
    message.update(change or stalled_body(None, text=""), seq=seq, time=time_)
    if change is not None:
        sink._add_log({"message": change["text"], "time": time_}, level=change["level"])


def _failed_store(sink: EventSink, message: dict[str, Any]) -> None:
    if message.get("traceback"):
        sink._add_log({**message, "message": message["traceback"]}, level="error")


class EventSink:
    def __init__(self, experiment: Experiment):
        self.experiment = experiment
        self.seq = experiment.last_seq
        self.points: list[SeriesPoint] = []
        self.logs: list[LogLine] = []
        self.messages: list[dict[str, Any]] = []
        self.updates: dict[str, Any] = {}
        # The training's time of the latest step this flush stores with several ranks' phases
        # (None: none), which the flush reports: one rank may lag (stragglers.py).
        self.phases_time: float | None = None
        self.unflushed_drop()
        self.channel_layer = get_channel_layer()
        self.step = experiment.step  # the run's latest step: where a machine sample is placed
        self.stepped = False  # a step event came (a script's observer's, or the engine's)
        # One whole copy of the model's parameters, which each rank's memory share is of: the
        # started event's, kept here since the row's run_info is written only at the flush.
        self.model_bytes = model_bytes_of(experiment.run_info)
        self.sent_at = -math.inf  # time.monotonic() of the last flush
        # The run's running throughput (throughput.py: the page's one figure, and each rank's),
        # from the windows stored so far (a next attempt goes on from them), then kept here:
        # read now, as the sink is made, so that `add` never waits on the database.
        self.throughput = run_throughput_read(experiment_id=experiment.pk)
        # A language model's (metrics/language.py): what its started event said (FLOPs per
        # token, the peak), its latest evaluation's bits per byte and MFU, and the texts kept.
        self.run_info: dict[str, Any] = dict(experiment.run_info or {})
        self.evaluated = {"bits_per_byte": experiment.bits_per_byte, "mfu": experiment.mfu}
        self.samples: list[dict[str, Any]] = list(experiment.samples or [])

    def unflushed_drop(self) -> None:
        """Nothing added since the last flush (or that flush rolled back: the next renumbers)."""
        self.points, self.logs, self.messages, self.updates = [], [], [], {}
        self.checkpoints, self.phases_time = CheckpointsPending(experiment=self.experiment), None

    def due_in(self, now: float) -> float | None:
        """Seconds until `flush` should run (0: now), or None with nothing to send. A message
        leaves at once unless one left less than SEND_GAP_SECONDS ago."""
        if not self.messages:
            return None
        return max(0.0, self.sent_at + SEND_GAP_SECONDS - now)

    def add(self, event: Event | Body) -> Message:
        """Number an event, queue its rows and its message; returns the message."""
        self.seq += 1
        # A report is trusted to be small, not to be well-formed: the handlers read it as a dict.
        message: dict[str, Any] = {**event, "seq": self.seq}
        for envelope in ("v", "minor", "run"):  # the training's, not the page's
            message.pop(envelope, None)
        store = self.EVENT_STORES.get(message["type"])
        if store is not None:
            store(self, message)
        self.messages.append(message)
        return cast(Message, message)

    def add_output(
        self, line: str, *, level: str, rank: int | None = None, machine: str = ""
    ) -> None:
        """A line of plain output: `output_body`'s."""
        self.add(output_body(line, level=level, rank=rank, machine=machine))

    def _started_store(self, message: dict[str, Any]) -> None:
        self.model_bytes = model_bytes_of(message)
        self.run_info = {k: v for k, v in message.items() if k not in {"seq", "type"}}
        self.updates.update(
            run_info=self.run_info,
            notes=list(message.get("notes") or []),
            total_steps=message.get("total_steps"),
        )
        for note in message.get("notes") or []:
            self._add_log({"seq": self.seq, "time": message.get("time"), "message": note})
        message["texts"] = started_texts(message)

    def _log_store(self, message: dict[str, Any]) -> None:
        self._add_log(message, level=str(message.get("level", "info")))

    def _checkpoint_store(self, message: dict[str, Any]) -> None:
        checkpoint = checkpoint_row(experiment=self.experiment, message=message)
        if checkpoint is not None:
            # The message tells the page where to download it (the size is what the worker saw)
            # and which older ones the training's retention has deleted (by step).
            message.update(
                size=checkpoint.size, url=checkpoint.get_absolute_url(),
                pruned=self.checkpoints.add(checkpoint),
            )  # fmt: skip
        # The page appends the same line live: the words are written here only.
        message["log_text"] = checkpoint_saved_text(message)
        self._add_log({**message, "message": message["log_text"]})
        message["texts"] = checkpoint_texts(message)

    def _profile_store(self, message: dict[str, Any]) -> None:
        # Stored at once, not at the flush: a rare event, and the row is what the API reads.
        profile = profile_event_store(experiment=self.experiment, message=message)
        message["view"] = profile_as_dict(profile=profile) if profile is not None else None
        message.pop("traces", None)  # the worker's paths: the view has the download urls
        message.pop("summary", None)  # in the view, with its texts

    def _add_point(self, message: dict[str, Any]) -> None:
        reported, epoch = message.get("step"), message.get("epoch")
        step = cast(int, reported) if is_count(reported) else self.step
        time_ = number_or_none(message.get("time")) or 0.0
        values = event_series(message)
        texts: dict[str, Any] = {}  # the page places them as they are
        if "rank/1/other_seconds" in values:  # a second rank's phases: one may lag
            self.phases_time = time_
        # An engine's epoch event says what each rank holds; a script's observer, each window
        # (protocol 1.12).
        if "memory" in message:
            # What each rank holds (protocol 1.7), checked and kept on the row (the read JSON's).
            # The page charts the entries the row keeps: the same points live as on a reload.
            entries = memory_entries(message["memory"])
            message["memory"] = self.updates["memory"] = entries
            values.update(_rank_series(entries, fields=MEMORY_FIELDS))
            texts["memory"] = memory_rows(entries, model_bytes=self.model_bytes)
        self._add_values(values, step=step, time_=time_)
        self.step, self.stepped = step, self.stepped or message["type"] == "step"
        self.updates.update(step=step, epoch=epoch if is_count(epoch) else 0)
        evaluated = evaluated_figures(values)
        self.updates.update(evaluated)
        throughput = self._throughput_add(values, step=step)
        message["throughput"] = run_figure(throughput)
        if self._language(message, evaluated, step=step):
            message["language"] = self._language_figures(sample=message["type"] == "epoch")
        stats = rank_stats_from_event(message)
        if stats is not None:
            self.updates["rank_stats"] = stats
            texts["ranks"] = rank_rows(rank_stats_so_far(stats, ranks=throughput.ranks()))
        if texts:
            message["texts"] = texts

    def _throughput_add(self, values: Mapping[str, float | None], *, step: int) -> Throughput:
        """The running throughput with this step or epoch event's figures added."""
        for key, value in values.items():
            if key.endswith("images_per_second") or key in (TOKENS_KEY, EPOCH_TOKENS_KEY):
                self.throughput.add(key, step, value)
        return self.throughput

    def _language(self, message: dict[str, Any], evaluated: dict[str, float], *, step: int) -> bool:
        """Whether the event is a language model's (it says its tokens/s); its evaluation's
        figures and text kept for the row (the latest SAMPLES_KEPT texts)."""
        if "tokens_per_second" not in message:
            return False
        self.evaluated.update({k: v for k, v in evaluated.items() if k in self.evaluated})
        text = sample_clean(message.get("sample"))
        if message["type"] == "epoch" and text is not None:
            message["sample"] = text
            self.samples = samples_with(self.samples, text=text, epoch=message.get("epoch"),
                                        step=step)  # fmt: skip
            self.updates["samples"] = self.samples
        return True

    def _language_figures(self, *, sample: bool) -> dict[str, Any]:
        """The run's figures so far; ``sample``: with its latest text (an evaluation's message:
        a step's would carry the same text each time)."""
        return language_figures(
            summed=self.throughput,
            run_info=self.run_info,
            bits_per_byte=self.evaluated["bits_per_byte"],
            mfu_reported=self.evaluated["mfu"],
            sample=self.samples[-1] if sample and self.samples else None,
        )

    def _add_values(self, values: dict[str, float | None], *, step: int, time_: float) -> None:
        self.points.extend(
            SeriesPoint(experiment_id=self.experiment.pk, key=key, step=step, time=time_, value=v)
            for key, v in values.items()
        )

    def add_series(self, values: Mapping[str, float | None], *, time_: float) -> None:
        """Samples taken beside the training (machine and GPU load), placed at the run's latest
        step; sent as one `series` message."""
        values = {key[:MAX_KEY_CHARS]: number_or_none(v) for key, v in values.items()}
        self._add_values(values, step=self.step, time_=time_)
        points = {key: [[self.step, time_, v]] for key, v in values.items()}
        body: SeriesBody = {"type": "series", "points": points}
        self.add(body)

    def _add_log(self, message: dict[str, Any], *, level: str = "info") -> None:
        self.logs.append(
            log_row(message, experiment_id=self.experiment.pk, seq=self.seq, level=level)
        )

    def flush(self) -> PhasesStored | None:
        """Store what was added, then send it. The database comes first: it is the record.

        Several processes write one run's events: the reaper's and a claim's status, and on a
        run over several machines each machine's supervisor. The run's row lock (SQLite's
        IMMEDIATE transactions: its write lock) numbers each flush after the last one stored.
        The messages go once the transaction has committed (the outermost one, where a caller
        holds one), so that whoever a message sends to the database finds what it says: a
        checkpoint's link, sent before the commit, answered 404 to a client that followed it at
        once. Sent right after the commit, flushes still reach pages in order; where another
        flush slips in between, the page sees a gap in seq and reads the stored run afresh.

        Returns where it stored windows of several ranks' phases (None: it stored none): the
        flush never reads back what it wrote; its caller looks for a straggler in them.
        """
        if not self.messages:
            return None
        with transaction.atomic():
            self._renumber()
            SeriesPoint.objects.bulk_create(self.points)
            LogLine.objects.bulk_create(self.logs)
            self.checkpoints.store()
            Experiment.objects.filter(pk=self.experiment.pk).update(
                last_seq=self.seq, **self.updates
            )
            messages, self.messages = self.messages, []
            transaction.on_commit(lambda: self._send(messages))
        stored = None
        if self.phases_time is not None:
            stored = PhasesStored(step=self.step, time=self.phases_time)
        self.unflushed_drop()  # the messages went with the transaction's send
        self.sent_at = time.monotonic()
        return stored

    def _renumber(self) -> None:
        """Move this flush's numbers (self.seq's last ones) to follow the run's stored last."""
        stored = (
            Experiment.objects.select_for_update()
            .filter(pk=self.experiment.pk)
            .values_list("last_seq", flat=True)
            .first()
        )
        shift = (stored or 0) - (self.seq - len(self.messages))
        if shift == 0 or stored is None:
            return
        for message in self.messages:
            message["seq"] += shift
        for line in self.logs:
            line.seq += shift
        self.seq += shift

    def _send(self, messages: list[dict[str, Any]]) -> None:
        events_broadcast(
            channel_layer=self.channel_layer, experiment_id=self.experiment.pk, messages=messages
        )

    # What each type stores besides its message (one entry per type; a type not here, such as
    # status or finished, is only sent).
    EVENT_STORES: ClassVar[dict[str, Callable[[EventSink, dict[str, Any]], None]]] = {
        "started": _started_store,
        "step": _add_point,
        "epoch": _add_point,
        "log": _log_store,
        "checkpoint": _checkpoint_store,
        "profile": _profile_store,
        "metrics": _metrics_store,
        "stalled": _stalled_store,
        "failed": _failed_store,
    }


MEMORY_KEYS = ("rank", *MEMORY_FIELDS)


def memory_entries(reported: Any) -> list[dict[str, int]]:
    """The epoch event's ``memory`` (protocol 1.7) as stored: counts only, bounded in length,
    so that a malformed event cannot put anything else in the row."""
    if not isinstance(reported, list):
        return []
    entries = []
    for entry in reported[:MAX_RANKS]:
        if isinstance(entry, dict) and all(is_count(entry.get(key)) for key in MEMORY_KEYS):
            entries.append({key: int(entry[key]) for key in MEMORY_KEYS})
    return entries
