"""A language model's figures (byte-llama, protocol 1.15): one definition for every place that
shows them, the run page, its read JSON, the compare and study pages.

- tokens/s: throughput.py's figure over the run's ``tokens_per_second`` series (the windows
  trained over the wall time of the step windows that trained them, x the window's bytes):
  images/s's definition, in tokens;
- MFU: that tokens/s x the model's FLOPs per token (the started event's ``model_info``:
  6N + 12 x layers x heads x head width x window) over the peak FLOP/s of the run's devices (the
  started event's ``peak_flops``: a GPU's table, or on the CPU a peak the engine measured once
  per machine, said as "measured peak"); where the run did not say both (an imported run), the
  MFU its last evaluation reported;
- bits per byte: the last evaluation's, as the row keeps it (sink.py), as test loss is;
- the texts the model wrote at its latest evaluations (the row's ``samples``).

A classifier's run has none of these: its read JSON says null (and no samples), its pages show
no column of dashes where no run compared is a language model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from dashboard.experiments.core.language_fields import run_language
from dashboard.experiments.metrics.throughput import Throughput, run_figure, throughputs_read
from dashboard.experiments.models import Experiment

TOKENS_TITLE: Final = "Tokens/s so far"
TOKENS_RULE: Final = (
    "Tokens/s: the bytes trained over the wall time of the steps that trained them, so far "
    "(start-up, evaluation and checkpoints left out), all ranks together: the throughput's "
    "images/s, in windows, x the window's bytes."
)
MFU_TITLE: Final = "MFU"
MFU_RULE: Final = (
    "Model FLOPs utilisation: the tokens/s so far x the model's FLOPs per token (6N + 12 x "
    "layers x heads x head width x window) ÷ the peak FLOP/s of the run's devices (a GPU's "
    "table; on the CPU a matrix-multiply peak the engine measured once on the machine)."
)
MEASURED_PEAK: Final = "measured peak"  # the engine's words for a calibrated CPU peak
BPB_TITLE: Final = "Bits per byte"
BPB_RULE: Final = (
    "Bits per byte: the held-out text's loss at the last evaluation in bits a byte (test loss "
    "÷ ln 2); lower is better, 8 knows nothing of the text."
)
SAMPLE_TITLE: Final = "What the model writes"
SAMPLE_RULE: Final = (
    "At each evaluation the model goes on from the held-out text's first window: its bytes, "
    "as UTF-8 text (bytes that are none replaced)."
)
# The latest texts the row keeps, and each one's bound: the engine writes a few hundred bytes.
SAMPLES_KEPT: Final = 3
SAMPLE_MAX_CHARS: Final = 2000


def language_model(experiment: Experiment) -> bool:
    """Whether the run trains a language model (and has these figures)."""
    return run_language(model=experiment.model, dataset=experiment.dataset)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


def run_peak(run_info: Mapping[str, Any]) -> tuple[float | None, float | None, str]:
    """The started event's FLOPs per token, peak FLOP/s and where the peak comes from."""
    model_info = run_info.get("model_info")
    flops = _number(model_info.get("flops_per_token")) if isinstance(model_info, dict) else None
    peak = _number(run_info.get("peak_flops"))
    source = run_info.get("peak_source")
    return flops, peak if peak and peak > 0 else None, source if isinstance(source, str) else ""


def mfu_of(tokens_per_second: float | None, run_info: Mapping[str, Any]) -> float | None:
    """The MFU of ``tokens_per_second`` on the run's devices; None where the run did not say
    its FLOPs per token and peak."""
    flops, peak, _ = run_peak(run_info)
    if tokens_per_second is None or flops is None or peak is None:
        return None
    return tokens_per_second * flops / peak


def tokens_text(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} tokens/s"


def mfu_text(value: float | None) -> str:
    # Small on a CPU: two significant figures, not a rounded 0%.
    return "—" if value is None else f"{value * 100:.2g}%"


def bpb_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def sample_when_text(sample: Mapping[str, Any] | None) -> str:
    """ "Written at epoch 2 (step 400)", or that none is yet."""
    if not sample:
        return "Written at each evaluation: none yet."
    epoch = sample.get("epoch")
    where = f"epoch {epoch} (step {sample.get('step')})" if epoch else f"step {sample.get('step')}"
    return f"Written at {where}."


def language_figures(
    *,
    summed: Throughput,
    run_info: Mapping[str, Any],
    bits_per_byte: float | None,
    mfu_reported: float | None = None,
    sample: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's tokens/s and MFU so far, its bits per byte, the latest text it wrote where
    given (an evaluation's message, the snapshot), and their texts (the run page places them
    as they are: live, from each step and epoch message, and on a reload)."""
    tokens = run_figure(summed, tokens=True)
    mfu = mfu_of(tokens, run_info)
    if mfu is None:
        mfu = mfu_reported
    _, _, source = run_peak(run_info)
    return {
        "tokens_per_second": tokens,
        "mfu": mfu,
        "bits_per_byte": bits_per_byte,
        # Where the peak comes from, in the engine's words; "measured peak" beside the figure
        # where the engine measured it.
        "peak_source": source or None,
        "sample": dict(sample) if sample else None,
        "texts": {
            "sample_when": sample_when_text(sample),
            "tokens_per_second": tokens_text(tokens),
            "mfu": mfu_text(mfu),
            "mfu_note": MEASURED_PEAK if source.startswith(MEASURED_PEAK) else "",
            "peak_source": source,
            "bits_per_byte": bpb_text(bits_per_byte),
        },
    }


def experiment_language(experiment: Experiment, summed: Throughput) -> dict[str, Any]:
    """``language_figures`` of a stored run, from its row and its series (``summed``)."""
    samples = experiment.samples or []
    return language_figures(
        summed=summed,
        run_info=experiment.run_info or {},
        bits_per_byte=experiment.bits_per_byte,
        mfu_reported=experiment.mfu,
        sample=samples[-1] if samples and isinstance(samples[-1], dict) else None,
    )


def sample_clean(text: Any) -> str | None:
    """An evaluation's text as the row keeps it: bounded, and storable (a NUL, which the
    model may write and PostgreSQL refuses in any text, and lone surrogates replaced)."""
    if not isinstance(text, str):
        return None
    bounded = text[:SAMPLE_MAX_CHARS].replace("\x00", "\ufffd")
    return bounded.encode("utf-8", "replace").decode("utf-8")


def samples_with(
    samples: list[dict[str, Any]], *, text: str, epoch: Any, step: int
) -> list[dict[str, Any]]:
    """The row's latest texts with this evaluation's, the oldest dropped past SAMPLES_KEPT."""
    entry = {"epoch": epoch if isinstance(epoch, int) else None, "step": step, "text": text}
    return [*samples, entry][-SAMPLES_KEPT:]


def language_page_texts() -> dict[str, str]:
    """The titles and rules the pages show beside these figures."""
    return {
        "tokens_title": TOKENS_TITLE,
        "tokens_rule": TOKENS_RULE,
        "mfu_title": MFU_TITLE,
        "mfu_rule": MFU_RULE,
        "bpb_title": BPB_TITLE,
        "bpb_rule": BPB_RULE,
        "sample_title": SAMPLE_TITLE,
        "sample_rule": SAMPLE_RULE,
    }


# The figures the compare and study tables show for a language model's run, by name.
TABLE_FIGURES: Final = ("tokens_per_second", "mfu", "bits_per_byte")


def runs_language_read(*, experiments: Iterable[Experiment]) -> dict[int, dict[str, Any]]:
    """Each language model's run's tokens/s, MFU, bits per byte and where its peak comes from
    (one query for them all: the tokens series alone); the other runs have no entry."""
    runs = [e for e in experiments if language_model(e)]
    tokens = throughputs_read(experiment_ids=[e.pk for e in runs], tokens=True)
    found = {}
    for e in runs:
        rate = tokens.get(e.pk)
        mfu = mfu_of(rate, e.run_info or {})
        found[e.pk] = {
            "tokens_per_second": rate,
            "mfu": e.mfu if mfu is None else mfu,
            "bits_per_byte": e.bits_per_byte,
            "peak_source": run_peak(e.run_info or {})[2] or None,
        }
    return found


def table_texts(figures: Mapping[str, Any] | None) -> dict[str, str]:
    """A table row's language figures in words ("" each for a classifier's: no dashes where
    a language model's run sits beside it)."""
    if figures is None:
        return dict.fromkeys(TABLE_FIGURES, "")
    return {
        "tokens_per_second": tokens_text(figures.get("tokens_per_second")),
        "mfu": mfu_text(figures.get("mfu")),
        "bits_per_byte": bpb_text(figures.get("bits_per_byte")),
    }
