"""The series contract: under which key each figure of a run is stored, and which chart draws it.

Its one home. The sink stores a step's and an epoch's figures under these keys
(runs/sink.py), the pages get the whole contract in their facts (``{% page_facts %}``), and
static/js/charts.js draws the charts listed here and files live messages' figures under the
same keys; it keeps no copy. The machine and GPU keys are written by
dashboard/devices/facts.py (``machine_samples_collect``), which may not import this room.
"""

# No ``from __future__ import annotations``: on Python 3.11 it hides ``NotRequired`` from
# ``TypedDict``'s ``__required_keys__`` (see training/protocol.py).

from typing import Any, Final, NotRequired, TypedDict

from dashboard.experiments.metrics.phases import PHASE_STYLES

# Event field -> series key, by event type (rank 0's figures are the run's own series).
STEP_SERIES: Final = {
    name: name
    for name in (
        "train_loss",
        "images_per_second",
        "lr",
        "data_seconds",
        "compute_seconds",
        "rss_bytes",
        # A language model's (protocol 1.15): bytes a second over all ranks, the model FLOPs
        # utilisation over the run's peak, the last step's gradient norm before clipping.
        "tokens_per_second",
        "mfu",
        "grad_norm",
    )
}
EPOCH_SERIES: Final = {
    "test_loss": "test_loss",
    "test_accuracy": "test_accuracy",
    "images_per_second": "epoch/images_per_second",
    # A language model's evaluation (protocol 1.15): the held-out loss in bits a byte and
    # e to it; the epoch's tokens/s and MFU, coarser than the steps' (as its images/s).
    "bits_per_byte": "bits_per_byte",
    "perplexity": "perplexity",
    "tokens_per_second": "epoch/tokens_per_second",
    "mfu": "epoch/mfu",
}
# Each rank's figures of a step (its `ranks`), stored as rank/<r>/<field>.
RANK_FIELDS: Final = ("images_per_second", "data_seconds", "compute_seconds", "rss_bytes")
# A language model's ranks also say their tokens/s (protocol 1.15), stored as rank/<r>/<field>
# where a rank's entry has it (a classifier's runs store no column of nulls).
LANGUAGE_RANK_FIELDS: Final = ("tokens_per_second",)
# Where each rank's wall time went and what it sent (protocol 1.9, training/observe/phases.py),
# stored as rank/<r>/<field> where a step's `ranks` carry them: with data_seconds the six *_seconds
# add up to the rank's wall time of the window (the read JSON's `breakdown` sums them over the run).
PHASE_FIELDS: Final = (
    "forward_seconds", "backward_seconds", "optimizer_seconds", "communication_seconds",
    "other_seconds", "communication_bytes",
)  # fmt: skip
# How late each rank entered the window's collectives after the others, per collective, and how
# many it entered (protocol 1.14), stored as rank/<r>/<field> where a step's `ranks` carry them:
# the straggler rule's figures (metrics/breakdown.py).
ARRIVAL_FIELDS: Final = ("arrived_late_seconds", "collectives")
# What each rank holds at an epoch's end (its `memory`, protocol 1.7's MemoryEntry less `rank`),
# stored as rank/<r>/<field> at the epoch's step: sharded strategies' 1/N over the epochs.
MEMORY_FIELDS: Final = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "peak_bytes")


class Section(TypedDict):
    """One foldable section of the run, compare and study pages: its title, and whether it is
    open until the user folds it (static/js/sections.js remembers their choice)."""

    id: str
    title: str
    open: bool


# The pages' sections in their order, the most read open (issue 34: pages as walls). A chart goes
# in its spec's section; the pages' templates put their tables and panels in the others.
SECTIONS: Final[tuple[Section, ...]] = (
    {"id": "summary", "title": "Summary", "open": True},
    {"id": "training", "title": "Training curves", "open": True},
    {"id": "time", "title": "Where the time goes", "open": True},
    {"id": "memory", "title": "Memory", "open": False},
    {"id": "ranks", "title": "Per rank", "open": False},
    {"id": "system", "title": "System", "open": False},
    {"id": "logs", "title": "Logs", "open": True},
    {"id": "profiles", "title": "Profiles", "open": True},
    {"id": "checkpoints", "title": "Checkpoints", "open": True},
)
# The sections that hold charts, and the one of a series the contract does not know (an imported
# run's own tags).
CHART_SECTIONS: Final = ("training", "time", "memory", "ranks", "system")
OTHER_SECTION: Final = "training"


class ChartSpec(TypedDict):
    """One chart of the run page. `match` is a regular expression over series keys, written in
    the syntax Python and JavaScript share; `line` names a line of a chart of several (per rank,
    machine, GPU), $1 and $2 being match's groups."""

    id: str
    title: str
    match: str
    section: str  # one of CHART_SECTIONS
    line: NotRequired[str]
    log: NotRequired[bool]  # the log scale is offered
    unit: NotRequired[str]  # "%" or "bytes"
    zero: NotRequired[bool]  # the y axis starts at 0: a size's level, not its wiggle, matters
    factor: NotRequired[float]  # fractions shown as percent
    color: NotRequired[str]  # a CSS variable of the stylesheet
    # False: the run page shows these figures another way (the phases' view) or not at all; the
    # compare and study pages, which overlay every stored series, still title them from here.
    run_page: NotRequired[bool]
    # A figure of the engine's step windows (static/js/windows.js): "sum" (seconds, bytes,
    # counts over the window) is drawn per step, so that an epoch's short last window does not
    # read as a drop; "rate" is drawn as it is. Both mark a short window's point.
    window: NotRequired[str]


def _per_rank(
    chart_id: str,
    field: str,
    title: str,
    unit: str | None = None,
    *,
    section: str = "ranks",
    zero: bool = False,
    run_page: bool = True,
    window: str | None = None,
) -> ChartSpec:
    """The chart of one of RANK_FIELDS, PHASE_FIELDS, ARRIVAL_FIELDS or MEMORY_FIELDS, a line
    per rank."""
    spec: ChartSpec = {
        "id": chart_id,
        "title": title,
        "match": rf"^rank/(\d+)/{field}$",
        "section": section,
        "line": "rank $1",
    }
    if unit:
        spec["unit"] = unit
    if zero:
        spec["zero"] = True
    if not run_page:
        spec["run_page"] = False
    if window:
        spec["window"] = window
    return spec


def _phase_charts() -> tuple[ChartSpec, ...]:
    """Each phase's seconds per rank, titled with the phase's label (metrics/phases.py): the run
    page draws them in its phases' view (static/js/phases.js), the other pages as charts."""
    charts = []
    for field in PHASE_FIELDS:
        name = field.removesuffix("_seconds")
        if name in PHASE_STYLES:
            title = f"{PHASE_STYLES[name][0]} per step, per rank (s)"
            charts.append(
                _per_rank(f"phase_{name}", field, title, section="time", run_page=False,
                          window="sum")
            )  # fmt: skip
    return tuple(charts)


# In the order the run page shows them.
CHARTS: Final[tuple[ChartSpec, ...]] = (
    # Training curves.
    {"id": "train_loss", "title": "Training loss", "match": "^train_loss$", "log": True,
     "color": "--chart-train", "section": "training"},
    {"id": "test_loss", "title": "Test loss", "match": "^test_loss$", "log": True,
     "color": "--chart-test", "section": "training"},
    {"id": "test_accuracy", "title": "Test accuracy", "match": "^test_accuracy$", "unit": "%",
     "factor": 100, "color": "--chart-acc", "section": "training"},
    {"id": "images_per_second", "title": "Images/s", "match": "^images_per_second$",
     "section": "training", "window": "rate"},
    {"id": "epoch_ips", "title": "Images/s per epoch", "match": "^epoch/images_per_second$",
     "section": "training", "run_page": False},
    {"id": "lr", "title": "Learning rate", "match": "^lr$", "log": True, "section": "training"},
    # A language model's (protocol 1.15): tokens are bytes here (byte-llama's vocabulary).
    {"id": "tokens_per_second", "title": "Tokens/s", "match": "^tokens_per_second$",
     "section": "training", "window": "rate"},
    {"id": "epoch_tps", "title": "Tokens/s per epoch", "match": "^epoch/tokens_per_second$",
     "section": "training", "run_page": False},
    {"id": "bits_per_byte", "title": "Bits per byte (test)", "match": "^bits_per_byte$",
     "color": "--chart-test", "section": "training"},
    {"id": "perplexity", "title": "Perplexity (test)", "match": "^perplexity$", "log": True,
     "section": "training"},
    {"id": "mfu", "title": "Model FLOPs utilisation", "match": "^mfu$", "unit": "%",
     "factor": 100, "section": "training", "window": "rate"},
    {"id": "epoch_mfu", "title": "Model FLOPs utilisation per epoch", "match": "^epoch/mfu$",
     "unit": "%", "factor": 100, "section": "training", "run_page": False},
    {"id": "grad_norm", "title": "Gradient norm (before clipping)", "match": "^grad_norm$",
     "log": True, "section": "training"},
    # Where the time goes.
    {"id": "data_seconds", "title": "Waiting for data per step (s)", "match": "^data_seconds$",
     "section": "time", "window": "sum"},
    {"id": "compute_seconds", "title": "Compute per step (s)", "match": "^compute_seconds$",
     "section": "time", "window": "sum"},
    *_phase_charts(),
    _per_rank("rank_sent", "communication_bytes", "Sent per step, per rank", unit="bytes",
              section="time", run_page=False, window="sum"),
    _per_rank("rank_late", "arrived_late_seconds", "Late at collectives per rank (s)",
              section="time", run_page=False, window="rate"),
    _per_rank("rank_collectives", "collectives", "Collectives per step, per rank",
              section="time", run_page=False, window="sum"),
    # Memory. What each rank holds changes little over epochs: from 0, so that DDP's whole copy
    # and FSDP's 1/N read as levels.
    {"id": "rss_bytes", "title": "Memory (RSS)", "match": "^rss_bytes$", "unit": "bytes",
     "section": "memory"},
    _per_rank("rank_rss", "rss_bytes", "Memory (RSS) per rank", unit="bytes", section="memory"),
    _per_rank("rank_parameters", "parameter_bytes", "Parameters held per rank", unit="bytes",
              section="memory", zero=True),
    _per_rank("rank_gradients", "gradient_bytes", "Gradients held per rank", unit="bytes",
              section="memory", zero=True),
    _per_rank("rank_optimizer", "optimizer_state_bytes", "Optimizer state held per rank",
              unit="bytes", section="memory", zero=True),
    _per_rank("rank_peak", "peak_bytes", "Peak memory per rank", unit="bytes", section="memory"),
    # Per rank.
    _per_rank("rank_ips", "images_per_second", "Images/s per rank", window="rate"),
    _per_rank("rank_tps", "tokens_per_second", "Tokens/s per rank", window="rate"),
    _per_rank("rank_data", "data_seconds", "Waiting for data per step, per rank (s)",
              window="sum"),
    _per_rank("rank_compute", "compute_seconds", "Compute per step, per rank (s)", window="sum"),
    # System.
    {"id": "cpu", "title": "Machine CPU", "match": r"^machine/(.+)/cpu_percent$", "unit": "%",
     "line": "$1", "section": "system"},
    {"id": "gpu_util", "title": "GPU utilisation", "match": r"^gpu/(.+)/(\d+)/utilization$",
     "unit": "%", "line": "$1 GPU $2", "section": "system"},
    {"id": "gpu_memory", "title": "GPU memory", "match": r"^gpu/(.+)/(\d+)/memory_bytes$",
     "unit": "bytes", "line": "$1 GPU $2", "section": "system"},
)  # fmt: skip


def series_contract_facts() -> dict[str, Any]:
    """The contract as the pages' facts carry it (Trainyard.facts.series in common.js)."""
    return {
        "charts": list(CHARTS),
        "sections": list(SECTIONS),
        "other_section": OTHER_SECTION,
        "step_series": STEP_SERIES,
        "epoch_series": EPOCH_SERIES,
        "rank_fields": list(RANK_FIELDS),
        "language_rank_fields": list(LANGUAGE_RANK_FIELDS),
        "phase_fields": list(PHASE_FIELDS),
        "memory_fields": list(MEMORY_FIELDS),
    }
