"""What the runs' JSON routes answer, as typed schemas for /api/schema/.

The routes build their JSON as they always did (selectors.experiment_as_dict, the models'
as_dict); these classes describe it, and tests/test_schemathesis.py checks every answer of the
live server against them. `extra="allow"`: a key added later is not an answer that breaks the
schema, and a client reading the documented keys keeps working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ninja import Schema
from pydantic import ConfigDict, create_model

from dashboard.experiments.metrics.breakdown import PHASES
from training.registry import OPTIONS_DECLARED


class Open(Schema):
    model_config = ConfigDict(extra="allow")


# Every declared strategy option (training/registry.py), typed as its values: what the run
# trains with where its strategy reads it, null where it does not. Made from the registry, so an
# option declared there is documented here with no edit.
if TYPE_CHECKING:
    OptionsOut = Open
else:
    OptionsOut = create_model(
        "OptionsOut",
        __base__=Open,
        **{option.name: (type(option.default) | None, ...) for option in OPTIONS_DECLARED},
    )


# A rank's share of its wall time in each phase (metrics/breakdown.py's PHASES, their one home
# on the web side), made from that list as OptionsOut is from the registry.
if TYPE_CHECKING:
    PhaseShares = Schema
else:
    PhaseShares = create_model(
        "PhaseShares", __base__=Schema, rank=(int, ...), **{name: (float, ...) for name in PHASES}
    )


class RunSharesOut(Schema):
    """A run's shares of its wall time (metrics/phases.py says how waiting is told apart)."""

    communication: float
    data: float
    waiting: float
    waiting_for: int | None


class StragglerOut(Schema):
    rank: int
    slower_by: float
    since_step: int
    late_seconds: float | None = None


class StalledRankOut(Open):
    rank: int
    collective: str  # "all_reduce #42": the last this rank entered ("" where it made none)
    entered: bool  # true: it is still in that collective (has not moved since)
    stack: str  # every thread's Python stack, taken from outside its code ("" in the list of runs)
    waiting_since: str | None = None  # ISO 8601, where it is still in it
    line: str = ""  # the launcher's words for it, against the latest any rank entered


class StalledOut(Open):
    since: str  # ISO 8601: the ranks' last step
    ranks: list[StalledRankOut]
    text: str = ""  # the launcher's sentence, the run log's line


class SampleOut(Schema):
    """A text a language model wrote at an evaluation (the engine's UTF-8, bytes that are none
    replaced)."""

    epoch: int | None
    step: int
    text: str


class ExperimentOut(OptionsOut):
    """A run, as every route that answers with one gives it."""

    id: int
    name: str
    model: str  # "simple-cnn", a torchvision classifier or a plug-in's name
    dataset: str
    # the image or text folder on the worker (dataset imagefolder or textfolder), else null
    data_path: str | None
    # A language model's (byte-llama): its size preset, window in bytes and whether tensor
    # parallel also splits it by sequence (null where the strategy does not split it), as it
    # trains with them; null for the other models.
    model_size: str | None = None
    seq_len: int | None = None
    sequence_parallel: bool | None = None
    strategy: str
    processes: int | None
    gpus: list[int]
    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    seed: int
    owner: str
    status: str
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    worker: str
    error: str
    test_loss: float | None
    test_accuracy: float | None
    # A language model's figures, null for the other models: tokens/s over the training so far
    # (as images/s is read), the model FLOPs utilisation of that figure against the peak of the
    # run's devices (`peak_source` says where the peak comes from: "measured peak (...)" on a
    # CPU), the last evaluation's bits per byte, and the latest texts the model wrote.
    tokens_per_second: float | None = None
    mfu: float | None = None
    bits_per_byte: float | None = None
    peak_source: str | None = None
    samples: list[SampleOut] = []
    epoch: int
    step: int
    total_steps: int | None
    last_seq: int
    notes: list[Any]
    dataset_source: Any = None
    waiting_reason: str
    attempt: int
    attempts: list[Any]
    heartbeat_at: str | None
    stop_requested: bool
    checkpoint_requested: bool
    cancelled_by: str | None
    duration: float | None
    url: str
    devices_label: str
    tags: list[str]
    note: str
    imported: bool
    # Several machines: how many, the ones it is pinned to (empty: any), and where it ran (the
    # current or last attempt's machines, node 0 first, with the ranks each ran).
    nodes: int
    machines: list[str]
    placement: list[dict[str, Any]]
    # What runs it: "celery" (the workers) or "slurm"; a Slurm run's partition ("": the
    # default), time limit (null: the partition's) and job: {job_id, state, reason} (the state
    # and Slurm's reason while it pends, as the reconciler last read them; null on the workers).
    backend: str = "celery"
    partition: str = ""
    time_limit_minutes: int | None = None
    scheduler: dict[str, str] | None = None
    # One entry per rank at the last epoch: rank, parameter_bytes, gradient_bytes,
    # optimizer_state_bytes, peak_bytes (empty before the first epoch).
    memory: list[dict[str, int]] = []
    # The queue and studies, where given.
    priority: int | None = None
    target_accuracy: float | None = None
    # The strategy's name with its options that are not at their default, in the registry's
    # words: "DistributedDataParallel (PowerSGD, ZeRO-1 optimizer)".
    strategy_label: str = ""
    # One entry per rank that reported its phases (protocol 1.9): `rank` and the shares of its
    # wall time over the run so far spent in `data`, `forward`, `backward`, `optimizer`,
    # `communication` (blocked in collectives computation does not hide) and `other`, adding up
    # to 1. Empty for a run from before 1.9, and in the list of runs.
    breakdown: list[PhaseShares] = []
    # The rank whose busy time (every phase but communication) over the latest 20 step events
    # is more than 1.5x the median of the other ranks' and, where the ranks say when they enter
    # their collectives (protocol 1.14), that comes to them last (metrics/breakdown.py), or
    # null: `slower_by` that ratio minus 1, `since_step` where its latest run of slow windows
    # began, `late_seconds` how late it enters each collective after the others (null where
    # the ranks do not say).
    straggler: StragglerOut | None = None
    # A running run whose ranks make no step while their processes live (protocol 1.13: a
    # script run's launcher watches them), or null: `since` their last step, and per rank the
    # latest collective any rank entered, whether it waits in it (`entered`) and its stack.
    stalled: StalledOut | None = None
    # A script run (strategy "script"): its file relative to its code folder, its arguments, and
    # its code, an upload's id (and the archive's SHA-256) or a folder on the workers; null (args:
    # empty) for the other strategies.
    entrypoint: str | None = None
    args: list[str] = []
    code: int | None = None
    code_path: str | None = None
    code_sha256: str | None = None
    # Reported from outside (a script elsewhere posts its events, POST .../events/): its last
    # post, and a sentence once it has been silent past TRAINYARD_REPORTED_SILENT_SECONDS.
    reported: bool = False
    last_heard_at: str | None = None
    silence_text: str = ""


class ExperimentListOut(Schema):
    count: int
    next: str | None
    experiments: list[ExperimentOut]


class LogLineOut(Schema):
    seq: int
    time: float  # seconds since the epoch
    level: str
    message: str
    rank: int | None


class LogsOut(Schema):
    id: int
    lines: list[LogLineOut]
    next: str | None
    ranks: list[int]


class SeriesBucketsOut(Schema):
    count: int
    # [step_first, step_last, time_first, time_last, min, max, mean, last, n]
    buckets: list[list[float | int | None]]


class MetricsOut(Schema):
    """Bucketed (the default) or, with ?raw=1, raw points `[step, time, value]` and `next`."""

    id: int
    budget: int | None = None
    step_range: list[int] | None = None
    global_batch_size: int | None = None
    series: dict[str, SeriesBucketsOut | list[list[float | int | None]]]
    next: str | None = None


class CheckpointOut(Schema):
    epoch: int
    step: int
    requested: bool
    path: str
    size: int | None
    worker: str
    created: str | None
    url: str
    api_url: str


class CheckpointsOut(Schema):
    id: int
    checkpoints: list[CheckpointOut]


class BaselineOut(Schema):
    id: int
    url: str
    throughput: float | None
    global_batch: int | None


class CompareRowOut(Open):
    id: int
    name: str
    url: str
    status: str
    strategy: str
    model: str
    dataset: str
    batch_size: int
    world_size: int | None
    global_batch: int | None
    throughput: float | None
    baseline: BaselineOut | None
    speedup: float | None
    efficiency: float | None
    test_accuracy: float | None
    # The run's memory at its last epoch: each rank's entry (as the run's read JSON), and the
    # largest rank's parameter + gradient + optimizer-state bytes and the highest peak (null
    # before the first epoch).
    memory: list[dict[str, int]] = []
    memory_held_bytes: int | None = None
    memory_peak_bytes: int | None = None
    # Shares of communication, data and waiting over the run, and what its efficiency lost to
    # in words (null without phases; the sentence also without an efficiency).
    phase_shares: RunSharesOut | None = None
    efficiency_reason: str | None = None
    # A language model's run: its tokens/s and MFU so far and its last bits per byte (as its
    # read JSON has them); null for the other models.
    tokens_per_second: float | None = None
    mfu: float | None = None
    bits_per_byte: float | None = None


class CompareOut(Schema):
    runs: list[CompareRowOut]
    missing: list[int]
    batch_warning: str | None
    baseline_rule: str


class LaunchLimitedOut(Open):
    """429: too many runs (or imports); `limit` says which, `retry_after` when to try again
    (seconds)."""

    error: str
    limit: Any = None
    retry_after: int | None = None


class QueueEntryOut(Open):
    id: int
    name: str
    owner: str
    status: str
    position: int
    ahead: int
    reason: str
    priority: int
    owner_running: int  # its owner's runs running now: the fewer, the sooner its turn
    owner_position: int  # its place among its owner's queued runs
    estimated_start: str | None
    estimated_start_seconds: float | None
    estimated_start_basis: str  # what the estimate rests on, in words
    url: str
    stop_url: str
    priority_url: str


class QueueOut(Open):
    """The queue in claim order; a user who is not staff sees their own entries only."""

    queue: list[QueueEntryOut]
    total: int
    summary: str
    estimate: str
    order: str  # how turns are shared between users, in one line
    can_set_priority: bool
    priority_range: list[int]
    now: str


class PriorityIn(Schema):
    priority: int


class ResumeIn(Schema):
    """The attempt the page showed stalled: a request for an attempt that is over is refused."""

    attempt: int


class PriorityOut(Open):
    """The run's queue entry (QueueEntryOut), or its id, priority and status if it just left."""

    id: int
    priority: int
    status: str
