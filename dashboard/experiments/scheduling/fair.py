"""Fair shares of the machines: whose queued run is next, between users.

First in, first out lets one user who queues many runs hold every machine while the others wait
behind them. Instead the users take turns: the next run is the next of the user with the fewest
runs running (counting the runs placed before it in this order as running), then, between users
with as many, the one served least lately (whose last run started longest ago, or never: round
robin where runs go one at a time), then the one whose oldest queued run has waited longest. A
user's own runs keep their order: priority (higher first), then first in, first out. Priority
never moves a run past another user's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Protocol, TypeVar


class Queued(Protocol):
    pk: int
    owner_id: int
    created_at: datetime


R = TypeVar("R", bound=Queued)


def fair_order(
    runs: Iterable[R], *, running: Counter[int], served: Mapping[int, datetime | None]
) -> list[R]:
    """`runs` (queued, each owner's in their own claim order) interleaved between owners.
    `running`: each owner's runs running now; `served`: when each owner's latest run started
    (an owner in neither has none)."""
    lines: dict[int, list[R]] = {}
    for run in runs:
        lines.setdefault(run.owner_id, []).append(run)
    waited = {owner: min((r.created_at, r.pk) for r in line) for owner, line in lines.items()}
    taken = Counter({owner: running[owner] for owner in lines})
    # Served least lately first: never (0, ...), at a time (1, time), placed here (2, turn).
    last: dict[int, tuple[int, float]] = {}
    for owner in lines:
        started = served.get(owner)
        last[owner] = (1, started.timestamp()) if started else (0, 0.0)
    nexts = dict.fromkeys(lines, 0)
    order: list[R] = []
    while lines:
        owner = min(lines, key=lambda o: (taken[o], last[o], waited[o]))
        order.append(lines[owner][nexts[owner]])
        taken[owner] += 1
        last[owner] = (2, float(len(order)))
        nexts[owner] += 1
        if nexts[owner] == len(lines[owner]):
            del lines[owner]
    return order
