"""Checks of a run's phases (protocol 1.9), shared by the engine's tests: each window's phases
add up to its wall time, and the windows' steps for counting bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from training.observe.phases import PHASES

if TYPE_CHECKING:  # tests.test_training imports these checks
    from tests.test_training import Result

SECONDS = [f"{name}_seconds" for name in PHASES]
# The phases must explain the wall time: what no phase marks (``other``) stays under this share
# (about 0.5% measured; the bound leaves room for a preemption on shared cores).
OTHER_AT_MOST = 0.25
# ... plus one preemption's worth of seconds: a one-step window lasts ~50 ms, and with four test
# workers on 2 cores the scheduler can take a rank off its core between two phases.
OTHER_SLACK_S = 0.025


def phase_windows(result: Result) -> list[tuple[int, dict[str, Any]]]:
    """(steps in the window, one rank's report) for every step event's every rank. Steps are
    counted over the run: a resumed one's first window starts after its earlier epochs."""
    started = result.started
    found, before = [], (started["start_epoch"] - 1) * started["steps_per_epoch"]
    for event in result.of_type("step"):
        found += [(event["step"] - before, rank) for rank in event["ranks"]]
        before = event["step"]
    assert found, "no step event carried its ranks' reports"
    return found


def assert_phases_add_up(result: Result) -> None:
    """Each window's phases sum to its wall time (the images over images/s: within rounding
    and 3%), and ``other`` is a small part of it. The window that ends an epoch may end with a
    short batch (a whole epoch's last): its steps' full batches over images/s then only bound
    its wall time from above."""
    batch, per_epoch = result.started["batch_size"], result.started["steps_per_epoch"]
    ends = [e["step"] % per_epoch == 0 for e in result.of_type("step") for _ in e["ranks"]]
    for (steps, rank), ends_epoch in zip(phase_windows(result), ends, strict=True):
        total = sum(rank[name] for name in SECONDS)
        wall = steps * batch / rank["images_per_second"]
        wall = min(wall, total) if ends_epoch else wall
        assert all(rank[name] >= 0 for name in SECONDS), rank
        assert abs(total - wall) <= 0.03 * wall + 0.002, (rank, wall)
        assert rank["other_seconds"] <= OTHER_AT_MOST * wall + OTHER_SLACK_S, (rank, wall)
        assert rank["forward_seconds"] > 0 and rank["backward_seconds"] > 0, rank
