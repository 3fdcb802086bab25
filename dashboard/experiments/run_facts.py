"""The run page's fact panels as text: per-rank figures, shared tensors, checkpoints.

static/js/experiment_run.js renders the same from live events; keep the two in step.
"""

from __future__ import annotations

from typing import Any

from dashboard.devices.views import bytes_text


def split_text(data_share: float) -> str:
    return f"{data_share:.0f}% waiting for data, {100 - data_share:.0f}% computing"


def _seconds_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def rank_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-rank figures with the share of time spent waiting for data, for the stacked bar."""
    rows = []
    for rank in stats.get("ranks") or []:
        data, compute = rank.get("data_seconds"), rank.get("compute_seconds")
        total = (data or 0) + (compute or 0)
        data_share = 100 * (data or 0) / total if total else 0
        ips = rank.get("images_per_second")
        rows.append(
            {
                **rank,
                "ips_text": "—" if ips is None else f"{ips:,.0f}",
                "data_text": _seconds_text(data),
                "compute_text": _seconds_text(compute),
                "rss_text": "—" if rank.get("rss_bytes") is None else bytes_text(rank["rss_bytes"]),
                "data_percent": round(data_share, 1),
                "compute_percent": round(100 - data_share, 1) if total else 0,
                "split_text": split_text(data_share) if total else "no timing reported",
            }
        )
    return rows


def run_facts_rows(facts: dict[str, Any]) -> dict[str, Any]:
    """Shared tensors with their sizes as text, and the total of those really shared."""
    tensors = []
    for tensor in facts["shared_tensors"]:
        shape = tensor.get("shape")
        tensors.append(
            {
                **tensor,
                "shape_text": " × ".join(str(n) for n in shape) if isinstance(shape, list) else "",
                "bytes_text": bytes_text(tensor.get("bytes")),
            }
        )
    shared = sum(
        t["bytes"] for t in tensors if t.get("is_shared") and isinstance(t.get("bytes"), int)
    )
    return {
        **facts,
        "shared_tensors": tensors,
        "shared_total_text": (
            f"{bytes_text(shared)} in shared memory: one copy, shared by every process."
        ),
    }


def checkpoint_rows(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**c, "size_text": "?" if c["size"] is None else bytes_text(c["size"])} for c in checkpoints
    ]
