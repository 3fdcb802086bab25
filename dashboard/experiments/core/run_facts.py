"""The run page's fact panels as text: per-rank figures, shared tensors, checkpoints (each
rank's memory: core/memory.py).

Written here only: the page renders them on the server (templates/experiments/_run_facts.html),
and the messages that keep it live carry the same texts (``texts``: the snapshot, built in
services.py, and the sink's step, epoch, started and checkpoint messages), so that
static/js/run_facts.js only places them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dashboard.texts import bytes_text, ranks_text


def split_text(data_share: float) -> str:
    return f"{data_share:.0f}% waiting for data, {100 - data_share:.0f}% computing"


def _seconds_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def rank_rows(stats: Mapping[str, Any]) -> list[dict[str, Any]]:
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


def tensor_rows(tensors: Any) -> list[dict[str, Any]]:
    """Shared tensors with their shape and size as text (what the run reported, checked)."""
    rows = []
    for tensor in tensors if isinstance(tensors, list) else []:
        if not isinstance(tensor, dict):
            continue
        shape = tensor.get("shape")
        rows.append(
            {
                **tensor,
                "shape_text": " × ".join(str(n) for n in shape) if isinstance(shape, list) else "",
                "bytes_text": bytes_text(tensor.get("bytes")),
            }
        )
    return rows


def shared_total_text(tensors: list[dict[str, Any]]) -> str:
    """The total of the tensors really shared: one copy, whatever the number of processes."""
    shared = sum(
        t["bytes"] for t in tensors if t.get("is_shared") and isinstance(t.get("bytes"), int)
    )
    return f"{bytes_text(shared)} in shared memory: one copy, shared by every process."


def checkpoint_texts(checkpoint: dict[str, Any]) -> dict[str, str]:
    size = checkpoint.get("size")
    return {
        "size_text": bytes_text(size) if isinstance(size, int) else "?",
        "kind_text": (
            "on request, mid-epoch" if checkpoint.get("requested") is True else "end of epoch"
        ),
    }


def checkpoint_rows(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**c, **checkpoint_texts(c)} for c in checkpoints]


def snapshot_texts(
    *,
    run: Mapping[str, Any],
    rank_stats: Mapping[str, Any],
    checkpoints: list[dict[str, Any]],
    memory: list[dict[str, Any]],
) -> dict[str, Any]:
    """The snapshot's ``texts``: its panels' rows, formatted (keyed as the live messages');
    ``memory``: the last epoch's rows, as core/memory.py writes them."""
    tensors = tensor_rows(run.get("shared_tensors"))
    return {
        "ranks": rank_rows(rank_stats),
        "memory": memory,
        "shared_tensors": tensors,
        "shared_total_text": shared_total_text(tensors),
        "checkpoints": checkpoint_rows(checkpoints),
        "machines_text": machines_text(run.get("machines")),
    }


def started_texts(message: dict[str, Any]) -> dict[str, Any]:
    """A ``started`` message's ``texts``: its shared tensors and its machines, formatted."""
    tensors = tensor_rows(message.get("shared_tensors"))
    return {
        "shared_tensors": tensors,
        "shared_total_text": shared_total_text(tensors),
        "machines_text": machines_text(message.get("machines")),
    }


def machines_text(machines: Any) -> str:
    """Which global ranks ran on which machine, from ``started.machines`` (rank order):
    "host-a: rank 0 · host-b: ranks 1, 2"; empty for a run on one machine."""
    if not isinstance(machines, list) or len(set(map(str, machines))) < 2:
        return ""
    ranks: dict[str, list[int]] = {}
    for rank, machine in enumerate(machines):
        ranks.setdefault(str(machine), []).append(rank)
    return " · ".join(f"{machine}: {ranks_text(held)}" for machine, held in ranks.items())
