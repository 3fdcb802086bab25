"""What each rank holds at an epoch's end (the epoch event's ``memory``, protocol 1.7), as the
pages show it.

Written here only: the run page's memory panel (rendered on the server, then kept live by the
epoch messages' ``texts.memory``, which the sink writes with ``memory_rows``), the compare page's
memory cell and the study table's. static/js places these texts and formats none of them.

A rank *holds* its parameters, gradients and optimizer state: what a strategy can shard. Its
*share* is its parameter bytes against one whole copy of the model's, the ``started`` event's
parameter count (``model_info``, counted before any sharding) at 4 bytes each: every strategy
keeps its parameters in float32. So DDP shows 100% on every rank and FSDP about 1/N;
DeepSpeed's ZeRO keeps whole parameters (100%) and shards the optimizer state (and at stage 2
the gradients), which the held bytes show; a model-parallel stage holds its part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from dashboard.experiments.models import Experiment
from dashboard.texts import bytes_text

# float32: every strategy keeps its parameters so (--precision's autocast computes in bf16 or
# fp16 but keeps them); a model built in another dtype would make the share off by that factor.
PARAMETER_BYTES_EACH: Final = 4

MEMORY_RULE: Final = (
    "Held: parameters + gradients + optimizer state, what a strategy can shard. Share: a rank's "
    "parameters against one whole copy of the model's (its parameters × 4 bytes, float32): DDP "
    "holds 100% on every rank, FSDP about 1/N; ZeRO keeps the whole parameters and shards the "
    "optimizer state (at stage 2 the gradients too). Peak: the GPU allocator's peak, or on the "
    "CPU the process's peak resident memory (interpreter, torch and data included)."
)
NO_MEMORY: Final = "—"
# What ``memory_summary`` finds (a study cell keeps each as memory_<name>).
SUMMARY_FIGURES: Final = ("held_bytes", "held_rank", "peak_bytes", "share")


def model_bytes_of(run_info: Mapping[str, Any] | None) -> int | None:
    """One whole copy of the model's parameters in bytes, from a ``started`` event (or the row's
    ``run_info``, which keeps it); None before protocol 1.6, which did not count them."""
    info = (run_info or {}).get("model_info")
    count = info.get("parameters") if isinstance(info, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return None
    return count * PARAMETER_BYTES_EACH


def _share_text(share: float | None) -> str:
    return NO_MEMORY if share is None else f"{share:.0%}"


def _share_title(share: float | None) -> str:
    if share is None:
        return "the run did not say how many parameters its model has"
    return f"{_share_text(share)} of the model's parameters"


def memory_row(entry: Mapping[str, int], *, model_bytes: int | None) -> dict[str, Any]:
    """One rank's entry with its held bytes, its share of the model and every figure as text."""
    held = entry["parameter_bytes"] + entry["gradient_bytes"] + entry["optimizer_state_bytes"]
    share = entry["parameter_bytes"] / model_bytes if model_bytes else None
    peak = bytes_text(entry["peak_bytes"])
    share_said = "" if share is None else f" · {_share_text(share)}"
    return {
        **entry,
        "held_bytes": held,
        "share": share,
        # The bar's width: a rank never holds more than the whole model, whatever it reports.
        "share_percent": None if share is None else round(min(100.0, 100 * share), 1),
        "parameters_text": bytes_text(entry["parameter_bytes"]),
        "gradients_text": bytes_text(entry["gradient_bytes"]),
        "optimizer_text": bytes_text(entry["optimizer_state_bytes"]),
        "held_text": bytes_text(held),
        "peak_text": peak,
        "share_text": _share_text(share),
        "share_title": _share_title(share),
        # The rank in one line (the compare page's list of every rank).
        "line_text": f"rank {entry['rank']}: {bytes_text(held)} held{share_said} · peak {peak}",
    }


def memory_rows(entries: Any, *, model_bytes: int | None) -> list[dict[str, Any]]:
    """Rows of the memory panel, rank order, from entries as the sink stores them."""
    if not isinstance(entries, list):
        return []
    return [memory_row(e, model_bytes=model_bytes) for e in entries if isinstance(e, dict)]


def experiment_memory_rows(experiment: Experiment) -> list[dict[str, Any]]:
    """The run's rows at its last epoch (``Experiment.memory``)."""
    return memory_rows(experiment.memory, model_bytes=model_bytes_of(experiment.run_info))


def memory_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The largest rank's held bytes (its number and share) and the highest peak of ``rows``:
    one run's, or a study cell's runs' pooled; null figures where there are no rows. ``texts``:
    ``memory_summary_texts``'."""
    rows = list(rows)
    largest = max(rows, key=lambda r: r["held_bytes"], default=None)
    figures: dict[str, Any] = dict.fromkeys(SUMMARY_FIGURES)
    if largest is not None:
        figures.update(
            held_bytes=largest["held_bytes"], held_rank=largest["rank"], share=largest["share"],
            peak_bytes=max(r["peak_bytes"] for r in rows),
        )  # fmt: skip
    return {**figures, "texts": memory_summary_texts(**figures)}


def memory_summary_texts(
    *, held_bytes: int | None, held_rank: int | None, peak_bytes: int | None, share: float | None
) -> dict[str, str]:
    """A memory cell's lines (compare page, study table): held, share, peak."""
    if held_bytes is None or peak_bytes is None:
        return {"held": NO_MEMORY, "share": "", "peak": ""}
    return {
        "held": f"{bytes_text(held_bytes)} held by rank {held_rank}",
        "share": "" if share is None else _share_title(share),
        "peak": f"peak {bytes_text(peak_bytes)}",
    }
