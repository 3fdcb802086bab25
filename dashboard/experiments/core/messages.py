"""The messages a run's page receives: the contract between the dashboard and the browser.

They come over the run's WebSocket, /ws/experiments/<id>/ (``consumers.py``); the page also
embeds a first ``snapshot`` (``views.experiment_detail``, with ``scaling``), so that it draws at
once. ``static/js/experiment_detail.js`` owns the socket and hands every message to
``static/js/run_facts.js``; each keeps one handler per type and ignores types it does not
know.

On every connect the first message is a ``snapshot``; then come the messages of the run's
``EventSink`` (``sink.py``), in ``seq`` order. ``seq`` is the dashboard's own numbering: per run,
1, 2, 3, ... with no gaps, stored as ``Experiment.last_seq``. The sink renumbers the training's
events (whose own ``seq`` counts per attempt) and numbers its own messages among them. A client
drops a message whose ``seq`` is not above the last it has, and reconnects (a fresh snapshot) on
a gap: channels-redis drops messages past its capacity without a word.

    snapshot    everything needed to draw the run from scratch; its seq is the last stored
    status      the run's status changed (queued and why it waits, running on a worker, lost)
    started     the training's events (``training/protocol.py``), as the training wrote them less
    step        the envelope's v, minor and run; seq is the sink's
    epoch
    checkpoint  the training's checkpoint event, plus where to download it (url, size), the
                steps whose files the training's retention has deleted (pruned) and the run
                log's line for it (log_text)
    profile     a profile's progress (protocol 1.10): the training's profile event (recording,
                ready, refused) or the dashboard's own refusal (a training that takes no
                profile requests), plus ``view``, the profile's row as it now stands
                (core/profiles.py's profile_as_dict: state, state_text, traces with their
                download urls, the summary with its texts); the page shows ``view`` as it is
    series      the dashboard's: points of series that no step or epoch event carries (the
                supervisor's samples of the worker's CPU and GPUs, keys as in series.py; a
                script's ``metrics`` events of protocol 1.11, which are sent as this),
                ``points: {key: [[step, time, value], ...]}``; the page appends each point to
                its series as a one-point bucket, as it does with step and epoch figures
    log         a line of the run's log: the training's log events, its plain output (stderr, and
                stdout lines that are no events), the dashboard's own words (a Stop, a request,
                the training's end, which the page shows as a line: the status is the dashboard's)
    scheduler   the dashboard's: a Slurm run's job changed (submitted, its state or reason as
                the reconciler or the job's start found it): ``scheduler``, the read JSON's
                {job_id, state, reason}, and ``text``, the page's "Slurm job" line
                (scheduling/slurm/texts.py's job_text); the snapshot's ``texts.scheduler``
                holds the same line
    straggler   the dashboard's: the rank named a straggler appeared, changed or cleared
                (runs/stragglers.py), with the sentence the page's banner shows (empty: none)
    stalled     the launcher's stalled event (protocol 1.13) as the row took it (runs/stalls.py):
                ``stalled``, the read JSON's (since, ranks with each one's stack, text), null
                once steps come again; ``text`` and ``level``, the run log's line ("": none);
                ``texts`` (core/stalls.py: since, each rank's line), which the banner places
    finished    the dashboard's: the run succeeded, with its final test loss and accuracy
    failed      the dashboard's: the run failed, was stopped or was lost; error says why
    error       the consumer's answer to anything a client sends (the channel is one-way); no seq

Between the sink (in a Celery worker) and the consumer (in the ASGI server) the channel layer
carries one ``GroupEvents`` message per flush, holding the numbered messages.

A field is added on the page side first (ignored until sent), then sent; a field is removed the
other way round.
"""

# No ``from __future__ import annotations``: on Python 3.11 it hides ``NotRequired`` from
# ``TypedDict``'s ``__required_keys__`` (see training/protocol.py).

from enum import IntEnum
from typing import Any, Final, Literal, NotRequired, TypedDict

from dashboard.experiments.core.stalls import Stalled, StalledTexts
from training.protocol import (
    CheckpointFields,
    EpochFields,
    LogFields,
    ProfileFields,
    StartedFields,
    StepFields,
)

# The channel layer's message type: the consumer's ``run_events`` handler takes it.
GROUP_MESSAGE_TYPE: Final = "run.events"

# The run's socket: routing.py serves this route and every page connects to `socket_path`.
SOCKET_PREFIX: Final = "ws/experiments/"
SOCKET_ROUTE: Final = rf"^{SOCKET_PREFIX}(?P<pk>\d+)/$"


def socket_path(pk: int) -> str:
    """The path a page opens for run `pk` (the page adds the scheme and host)."""
    return f"/{SOCKET_PREFIX}{pk}/"


class SocketClose(IntEnum):
    """The run socket's close codes; pages get them in their facts (common.js `runSocket`)."""

    FINAL = 1000  # the page's: the run is final, nothing more will come
    # The page's: a gap in seq or a resumed attempt; reconnect for a fresh snapshot. The
    # server's: the socket's session is gone (a logout, or a password change that gave it a new
    # key): a reconnect's handshake decides.
    RESYNC = 4000
    UNAUTHENTICATED = 4401  # the consumer's refusals: retrying would not help
    FORBIDDEN = 4403


class Numbered(TypedDict):
    seq: int  # the sink's number for the message (see above)


# ---- what the dashboard says itself: the body a service hands EventSink.add, then the message


class StatusBody(TypedDict):
    type: Literal["status"]
    status: str  # a Status value
    reason: NotRequired[str]  # queued: why it waits; lost: why it was given up
    worker: NotRequired[str]  # running: the worker that took it
    # Running: for a page opened while queued, whose Started and Duration need it.
    started_at: NotRequired[str | None]  # ISO 8601
    attempt: NotRequired[int]  # running: 1, 2, ... (a lost run is started again)
    # Running again after a loss: the page reloads, the new attempt replaces points after its
    # checkpoint.
    resumed: NotRequired[bool]


class RunFinishedBody(TypedDict):
    type: Literal["finished"]
    status: str  # "succeeded"
    test_loss: float | None
    test_accuracy: float | None


class RunFailedBody(TypedDict):
    type: Literal["failed"]
    status: str  # "failed" or "cancelled"
    error: str
    traceback: NotRequired[str]  # also stored as an error line of the log


class SeriesBody(TypedDict):
    type: Literal["series"]
    points: dict[str, list[list[Any]]]  # key -> [[step, time, value], ...]


class StragglerBody(TypedDict):
    type: Literal["straggler"]
    # The read JSON's straggler ({rank, slower_by, since_step}), None when it cleared.
    straggler: dict[str, Any] | None
    text: str  # the sentence the run's log got; the banner shows it while a rank is named


class StalledBody(TypedDict):
    type: Literal["stalled"]
    stalled: Stalled | None  # the read JSON's stalled, None once steps come again
    texts: StalledTexts
    text: str  # the line the run's log got ("": none, the row was not changed)
    level: str  # its level: warning when a stall begins, info when it is over
    time: NotRequired[float]  # the training's, as the event said it


class SchedulerBody(TypedDict):
    type: Literal["scheduler"]
    scheduler: dict[str, str]  # the read JSON's: job_id, state, reason
    text: str  # the run page's line for its job


class LogBody(LogFields):
    type: Literal["log"]
    time: NotRequired[float]  # the training's (seconds since it started); none for plain output
    rank: NotRequired[int]  # the rank that wrote it (its stderr, or rank 0's event); none else
    # The worker machine that relayed it, on a run over several machines; none else.
    machine: NotRequired[str]


class ProfileBody(ProfileFields):
    type: Literal["profile"]


class StatusMessage(StatusBody, Numbered):
    pass


class StragglerMessage(StragglerBody, Numbered):
    pass


class SchedulerMessage(SchedulerBody, Numbered):
    pass


class StalledMessage(StalledBody, Numbered):
    pass


class RunFinishedMessage(RunFinishedBody, Numbered):
    pass


class RunFailedMessage(RunFailedBody, Numbered):
    pass


class LogMessage(LogBody, Numbered):
    pass


class SeriesMessage(SeriesBody, Numbered):
    pass


# ---- the training's events, relayed ------------------------------------------------------------


# ``texts``: the message's figures as the page shows them (run_facts.py writes them, the page
# only places them): started {shared_tensors: rows with shape_text and bytes_text,
# shared_total_text, machines_text: which ranks ran on which machine, "" on one}; step and
# epoch {ranks: rows with ips_text (the rank's images/s over the training so far), data_text,
# compute_text, rss_text, split_text, data_percent, compute_percent, and machine on several
# machines}, when the event has per-rank figures; epoch (and a script's step, protocol 1.12)
# also {memory: each rank's entry of its `memory` (protocol 1.7, as stored: counts only) with
# held_bytes, share, share_percent and parameters_text, gradients_text, optimizer_text,
# held_text, peak_text, share_text (core/memory.py)}, when it has memory;
# checkpoint {size_text, kind_text}; the snapshot all of these, its checkpoints as rows, its
# memory the last epoch's (``Experiment.memory``).


class StartedMessage(StartedFields, Numbered):
    type: Literal["started"]
    time: float
    texts: dict[str, Any]


class StepMessage(StepFields, Numbered):
    type: Literal["step"]
    time: float
    texts: NotRequired[dict[str, Any]]
    # The run's images/s over the training so far (metrics/throughput.py), the page's headline
    # figure; the event's own images_per_second is its window's (the chart's point).
    throughput: NotRequired[float | None]
    # A language model's (protocol 1.15): its tokens/s and MFU so far, the last evaluation's
    # bits per byte, and their texts (metrics/language.py's language_figures).
    language: NotRequired[dict[str, Any]]


class EpochMessage(EpochFields, Numbered):
    type: Literal["epoch"]
    time: float
    texts: NotRequired[dict[str, Any]]
    throughput: NotRequired[float | None]  # as the step message's
    language: NotRequired[dict[str, Any]]  # as the step message's; `sample` is the text written


class CheckpointMessage(CheckpointFields, Numbered):
    type: Literal["checkpoint"]
    time: float
    size: int | None  # bytes, as the worker saw the file; None when it could not
    url: str  # the page's download link
    pruned: list[int]  # steps of older checkpoints whose files are gone
    log_text: str  # the run log's line for it, as stored
    texts: dict[str, str]


class ProfileMessage(ProfileFields, Numbered):
    type: Literal["profile"]
    time: NotRequired[float]  # the training's; none for the dashboard's own refusal
    view: dict[str, Any] | None  # core/profiles.profile_as_dict; None for no row of this run


# ---- per-rank figures, as stored and as the snapshot sends them -------------------------------


class RankRow(TypedDict):
    rank: int
    images_per_second: float | None
    data_seconds: float | None
    compute_seconds: float | None
    rss_bytes: float | None
    machine: NotRequired[str]  # the worker machine it ran on, on a run over several machines


class RankStats(TypedDict):
    """The last step or epoch event's per-rank figures (``Experiment.rank_stats``)."""

    type: str  # "step" or "epoch"
    step: int | None
    epoch: int | None
    time: float | None
    ranks: list[RankRow]


# ---- the first message, and the consumer's own ------------------------------------------------


class SnapshotMessage(TypedDict):
    type: Literal["snapshot"]
    seq: int  # the last message stored: later ones follow it
    experiment: dict[str, Any]  # selectors.experiment_as_dict: the run's row, as the API gives it
    # series.series_buckets (default budget): every series of the run, bucketed by step, at
    # most ~1000 buckets each whatever the run's length: {key: {count, buckets}}.
    series: dict[str, Any]
    logs: list[dict[str, Any]]  # LogLine.as_dict (seq, time, level, message): the last lines
    run: dict[str, Any]  # selectors.experiment_run_facts: shared tensors, stages, world size
    rank_stats: dict[str, Any]  # a RankStats (below), or {} before the first step event
    checkpoints: list[dict[str, Any]]  # checkpoints.checkpoint_as_dict, in step order
    scaling: NotRequired[dict[str, Any]]  # embedded in the page only: scaling.py's facts
    texts: dict[str, Any]  # run_facts.snapshot_texts: the panels' rows, formatted
    throughput: float | None  # as a step message's: the run's images/s so far
    language: dict[str, Any] | None  # as a step message's; None for a model that is no LM


class ErrorMessage(TypedDict):
    type: Literal["error"]
    error: str


class GroupEvents(TypedDict):
    """The channel layer's message from a sink's flush to every consumer of the run."""

    type: Literal["run.events"]
    events: list["Message"]


# What EventSink.add takes: a training event (training/protocol.py) or the dashboard's own body.
Body = (
    StatusBody
    | RunFinishedBody
    | RunFailedBody
    | LogBody
    | SeriesBody
    | StragglerBody
    | StalledBody
    | ProfileBody
    | SchedulerBody
)

Message = (
    SnapshotMessage
    | StatusMessage
    | StartedMessage
    | StepMessage
    | EpochMessage
    | CheckpointMessage
    | ProfileMessage
    | LogMessage
    | SeriesMessage
    | StragglerMessage
    | StalledMessage
    | SchedulerMessage
    | RunFinishedMessage
    | RunFailedMessage
    | ErrorMessage
)
