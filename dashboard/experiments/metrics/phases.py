"""The phases where decisions are made: their labels and colours, and what a run lost to.

The phases' names are breakdown.PHASES; their labels and colours (CSS variables of
static/css/app.css) live here and reach the pages in the page facts (``phases``), so that
static/js/phases.js keeps no copy.

A run's shares (the compare page's and a study cell's column, the scaling sentence) come from
breakdown.experiments_breakdown, each rank's shares of its wall time over the run:

- ``data``: the mean over ranks of the data share.
- ``communication``: the least communication share of any rank. Synchronous methods give every
  rank the same wall time per step, so the rank that arrives last at a collective waits for
  nobody: its share is the transfer itself, which every rank pays.
- ``waiting``: the mean over ranks of what each spends in communication beyond that least
  share: time a rank sits in a collective for a slower rank to arrive. ``waiting_for`` is the
  rank with the least communication share (the one the others wait for), named only where the
  waiting is at least WAITING_NAMED.

So communication + waiting is the ranks' mean communication share. One rank: no waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypedDict

from dashboard.experiments.metrics.breakdown import PHASES, RankBreakdown

# Label and colour (a CSS variable) of each phase, in breakdown.PHASES' order.
PHASE_STYLES: Final = {
    "data": ("Data", "--phase-data"),
    "forward": ("Forward", "--phase-forward"),
    "backward": ("Backward", "--phase-backward"),
    "optimizer": ("Optimizer", "--phase-optimizer"),
    "communication": ("Communication", "--phase-communication"),
    "other": ("Other", "--phase-other"),
}
# The rank others wait for is named from this share of waiting on (a hundredth: noise below).
WAITING_NAMED: Final = 0.01
NOT_MEASURED = "phases not measured for this run"
SHARES_RULE = (
    "Where the time went, over the whole run: communication is the least share of wall time any "
    "rank spends in collectives (the transfer every rank pays); waiting is what the ranks spend "
    "there beyond it on average, waiting for the slowest rank to arrive (named where it is 1% "
    "or more); data is the ranks' mean share waiting for batches. A study cell's are the mean "
    "over its seeds."
)


class RunShares(TypedDict):
    communication: float
    data: float
    waiting: float
    waiting_for: int | None  # the rank the others wait for, or None


def phase_facts() -> dict[str, Any]:
    """The phases as the pages' facts carry them (Trainyard.facts.phases, phases.js)."""
    return {
        "phases": [
            {
                "name": name,
                "label": PHASE_STYLES[name][0],
                "color": PHASE_STYLES[name][1],
                "field": f"{name}_seconds",
            }
            for name in PHASES
        ],  # fmt: skip
        "bytes_field": "communication_bytes",
        "not_measured": NOT_MEASURED[0].upper() + NOT_MEASURED[1:] + ".",
    }


def run_shares(breakdown: Sequence[RankBreakdown]) -> RunShares | None:
    """A run's shares from its ranks' (see the module docstring); None without phases."""
    if not breakdown:
        return None
    least = min(breakdown, key=lambda entry: (entry["communication"], entry["rank"]))
    waiting = _mean([e["communication"] - least["communication"] for e in breakdown])
    return RunShares(
        communication=round(least["communication"], 4),
        data=_mean([e["data"] for e in breakdown]),
        waiting=waiting,
        waiting_for=least["rank"] if waiting >= WAITING_NAMED else None,
    )


def shares_pooled(found: Sequence[RunShares]) -> RunShares | None:
    """A study cell's shares: the mean over its runs that measured them; the rank waited for
    is the one of the run that waited most."""
    if not found:
        return None
    most = max(found, key=lambda shares: shares["waiting"])
    return RunShares(
        communication=_mean([s["communication"] for s in found]),
        data=_mean([s["data"] for s in found]),
        waiting=_mean([s["waiting"] for s in found]),
        waiting_for=most["waiting_for"],
    )


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4)


def _parts(shares: RunShares) -> list[str]:
    waiting = "waiting"
    if shares["waiting_for"] is not None:
        waiting += f" for rank {shares['waiting_for']}"
    return [
        f"{share:.0%} {name}"
        for share, name in (
            (shares["communication"], "communication"),
            (shares["data"], "data"),
            (shares["waiting"], waiting),
        )
    ]


def shares_text(shares: RunShares | None) -> str:
    """The compact column: "31% communication · 9% data · 8% waiting for rank 1"."""
    return "—" if shares is None else " · ".join(_parts(shares))


def efficiency_reason_text(*, efficiency: float | None, shares: RunShares | None) -> str | None:
    """What the efficiency lost to, in a sentence built from the figures: "efficiency 52%: 31%
    communication, 9% data, 8% waiting for rank 1"; None without an efficiency."""
    if efficiency is None:
        return None
    head = f"efficiency {efficiency:.0%}"
    if shares is None:
        return f"{head}: {NOT_MEASURED}"
    return f"{head}: " + ", ".join(_parts(shares))
