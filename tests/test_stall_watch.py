"""The launcher's stall watch (training/observe/stall.py) over ranks' progress records
(training/observe/progress.py), written here as the ranks' observers write them, with the
watch's clock given. Both records live in this process: its stack, dumped by faulthandler on
the watch's signal, is each rank's. tests/test_script_observer.py has a real hung rank."""

from __future__ import annotations

import faulthandler
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from training.observe.progress import STACK_SIGNAL, ProgressWriter, progress_read
from training.observe.progress_hooks import ProgressHooks
from training.observe.stall import StallWatch, stall_floor


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[tuple[ProgressWriter, ProgressWriter]]:
    writers = (ProgressWriter(tmp_path, 0), ProgressWriter(tmp_path, 1))
    yield writers
    faulthandler.unregister(STACK_SIGNAL)
    for writer in writers:
        writer.stacks.close()


def steps(writers: tuple[ProgressWriter, ...], step: int) -> None:
    """A step on each rank, with its all-reduce entered (and left: the step comes after it)."""
    for writer in writers:
        writer.forwarded()
        writer.entered("all_reduce")
        writer.stepped(step)


def test_a_stall_past_the_floor_names_who_never_entered_and_ends_at_a_step(
    tmp_path: Path, ranks: tuple[ProgressWriter, ProgressWriter]
) -> None:
    first, second = ranks
    steps(ranks, 1)
    first.entered("all_reduce")  # rank 0 waits in the second all-reduce, rank 1 never comes
    watch = StallWatch(tmp_path, floor=5)
    now = time.time()
    assert watch.check(now + 4) is None
    stalled = watch.check(now + 10)
    assert stalled is not None
    assert (
        stalled["text"].startswith("No step for 1")
        and " s: rank 1 never entered " in (stalled["text"])
    )
    assert "all_reduce #2; rank 0 waits in it since " in stalled["text"]
    waiting, hung = stalled["ranks"]
    assert (waiting["entered"], hung["entered"]) == (True, False)
    assert (waiting["collective"], hung["collective"]) == ("all_reduce #2", "all_reduce #1")
    assert hung["line"] == "rank 1 never entered all_reduce #2: its last, all_reduce #1, done"
    assert stalled["since"] == pytest.approx(waiting["waiting_since"], abs=0.01)
    assert stalled["since"] == pytest.approx(now, abs=5)
    # The stack each rank's faulthandler dumped: this process's, here, at the watch's call.
    assert "test_stall_watch.py" in hung["stack"] and "in stacks_take" in hung["stack"]
    assert watch.check(now + 20) is None  # said once
    second.stepped(2)
    over = watch.check(now + 30)
    assert over is not None and over["since"] is None and over["ranks"] == []
    assert "steps again" in over["text"]


def test_the_bound_is_ten_median_steps_over_the_floor(
    tmp_path: Path, ranks: tuple[ProgressWriter, ProgressWriter]
) -> None:
    watch = StallWatch(tmp_path, floor=5)
    start = time.time()
    for step in range(1, 7):  # a step every 3 s, as the watch sees them
        steps(ranks, step)
        assert watch.check(start + 3 * step) is None
    assert watch.bound() == pytest.approx(30)
    # The records' last move is now (the steps were written at once): 25 s on, within the bound.
    assert watch.check(start + 25) is None
    stalled = watch.check(start + 35)
    assert stalled is not None and "no rank waits in a collective" in stalled["text"]


def test_a_pause_of_the_watch_itself_is_not_the_ranks_stall(
    tmp_path: Path, ranks: tuple[ProgressWriter, ProgressWriter]
) -> None:
    """An engine run's watch is a thread of rank 0: a run suspended whole (every process) and
    continued finds its records old; it judges them from its own return on."""
    watch = StallWatch(tmp_path, floor=5, unwatched="a rank's training ended")
    steps(ranks, 1)
    now = time.time()
    watch.paused(now + 100)
    assert watch.check(now + 101) is None and watch.check(now + 104) is None
    stalled = watch.check(now + 106)  # past the floor after the watch came back
    assert stalled is not None and stalled["since"] == pytest.approx(now + 100)
    ranks[1].unwatched()  # a rank ended: the stall is over, in the engine's words
    over = watch.check(now + 110)
    assert over is not None and over["text"].endswith("a rank's training ended.")


def test_no_stall_before_the_first_step_or_while_a_rank_is_unwatched(
    tmp_path: Path, ranks: tuple[ProgressWriter, ProgressWriter]
) -> None:
    watch = StallWatch(tmp_path, floor=1)
    assert watch.check(time.time() + 100) is None  # loading, compiling: no step time yet
    steps(ranks, 1)
    ranks[1].unwatched()  # its observer left: its steps are no longer counted
    assert watch.check(time.time() + 200) is None
    assert [(r.rank, r.watched, r.step) for r in progress_read(tmp_path)] == [
        (0, True, 1),
        (1, False, 1),
    ]


def test_the_floor_is_the_environments() -> None:
    assert stall_floor({}) == 60
    assert stall_floor({"TRAINYARD_STALL_SECONDS": "2"}) == 2
    assert stall_floor({"TRAINYARD_STALL_SECONDS": "soon"}) == 60


def test_a_record_the_observer_left_is_still_fed_by_its_own_hooks(tmp_path: Path) -> None:
    """The observer stopped measuring (a hook raised, its ranks did not meet): the record's own
    hooks count any optimizer's steps on from the observer's, and say forwards."""
    import torch

    hooks = ProgressHooks(tmp_path, 0)
    try:
        hooks.fallback(step=5)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        [record] = progress_read(tmp_path)
        assert (record.watched, record.step) == (True, 6) and record.forward_at > 0
        hooks.remove()  # the script's end: hooks out, the record no longer judged
        optimizer.step()
        [record] = progress_read(tmp_path)
        assert (record.watched, record.step) == (False, 6)
    finally:
        hooks.remove()
        faulthandler.unregister(STACK_SIGNAL)
        hooks.writer.stacks.close()
