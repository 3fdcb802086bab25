"""What observing leaves a training when it fails or is turned off (issue 33's review): the
collectives' wrappers keep no time with the clock off and never fail the training's own
collective; one rank's profile error does not move its windows; the engine's stall watch that
cannot start leaves the run training; a rank's records' folder whose run was killed is removed
by the next run; a rank done with its watch ignores a late stack signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from training.observe import collectives, phases
from training.observe.progress import RECORDS_PREFIX, STACK_SIGNAL, records_folder_make
from training.observe.rank_watch import rank_watch
from training.scripts.observer import Observer


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> phases.PhaseClock:
    fresh = phases.PhaseClock()
    monkeypatch.setattr(phases, "CLOCK", fresh)
    return fresh


def _collective(calls: list[str]) -> Any:
    def all_reduce(tensor: Any, group: Any = None) -> str:
        calls.append("ran")
        return "done"

    return collectives._timed(all_reduce, collectives.SENDS["all_reduce"], arrives=True)


def test_with_the_clock_off_a_collective_is_not_timed_counted_or_marked(
    clock: phases.PhaseClock,
) -> None:
    calls: list[str] = []
    clock.enabled = False
    assert _collective(calls)(SimpleNamespace()) == "done"
    assert calls == ["ran"] and clock.read() == (0.0, 0.0, 0.0, 0.0, 0.0)
    assert clock.arrivals_read() == (0, 0.0)


def test_a_clock_that_raises_is_turned_off_and_the_collective_still_runs(
    clock: phases.PhaseClock, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(name: str) -> None:
        raise RuntimeError("no event recorded")

    monkeypatch.setattr(clock, "enter", broken)
    calls: list[str] = []
    timed = _collective(calls)
    assert timed(SimpleNamespace()) == "done" and timed(SimpleNamespace()) == "done"
    assert calls == ["ran", "ran"] and not clock.enabled
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "trainyard's phase clock stopped: RuntimeError: no event recorded; training goes on, "
        "untimed"
    ]
    assert getattr(collectives._INSIDE, "depth", 0) == 0  # the next one is counted again


def test_a_profile_error_on_one_rank_leaves_its_windows_where_the_others_are(
    clock: phases.PhaseClock, capsys: pytest.CaptureFixture[str]
) -> None:
    observer = Observer({"RANK": "0", "WORLD_SIZE": "1", "TRAINYARD_OBSERVE_EVERY": "4"})
    closed: list[int] = []
    close = observer.window_close

    def window_close() -> None:
        closed.append(observer.step)
        close()

    observer.window_close = window_close  # type: ignore[method-assign]

    def raises(*, gather: Any) -> None:
        if observer.step == 3:
            raise OSError("no space left on device")

    observer.profiles.stepped = raises  # type: ignore[method-assign]
    for _ in range(9):
        observer.step_end()
    assert closed == [1, 5, 9]  # as every other rank closes them
    assert "trainyard's profiler raised at a step: OSError" in capsys.readouterr().err


def test_a_stall_watch_that_cannot_hook_the_groups_leaves_the_run_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.observe import rank_watch as module

    class Broken:
        def __init__(self, *args: Any) -> None:
            raise RuntimeError("register_pre_hook: not on this backend")

    monkeypatch.setattr(module, "RankWatch", Broken)
    rt = SimpleNamespace(distributed=True, rank=0, local_rank=0, is_main=True)
    environ = {"TRAINYARD_PROGRESS_DIR": str(tmp_path)}
    assert rank_watch(rt, events=None, environ=environ) is None  # type: ignore[arg-type]


def test_a_killed_runs_records_folder_is_removed_by_the_next_run_a_live_ones_kept() -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tempfile.mkdtemp(prefix=f"{RECORDS_PREFIX}{gone.stdout.strip()}-")
    Path(dead, "progress-0.bin").write_bytes(b"x")
    live = tempfile.mkdtemp(prefix=f"{RECORDS_PREFIX}{os.getppid()}-")
    made = records_folder_make()
    try:
        assert not Path(dead).exists() and Path(live).is_dir() and Path(made).is_dir()
        assert Path(made).name.startswith(f"{RECORDS_PREFIX}{os.getpid()}-")
    finally:
        for folder in (live, made):
            os.rmdir(folder)


def test_a_rank_done_with_its_watch_ignores_a_late_stack_signal() -> None:
    ended = subprocess.run([sys.executable, "-c", (
        "import os, signal, tempfile\n"
        "from types import SimpleNamespace\n"
        "from training.observe.rank_watch import RankWatch\n"
        "rt = SimpleNamespace(rank=1, local_rank=1, is_main=False)\n"
        "watch = RankWatch(__import__('pathlib').Path(tempfile.mkdtemp()), rt, None, 60.0)\n"
        "watch.close()\n"
        f"os.kill(os.getpid(), {int(STACK_SIGNAL)})\n"
        "print('alive')\n"
    )], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert ended.returncode == 0 and ended.stdout == "alive\n", ended.stderr
    assert signal.getsignal(STACK_SIGNAL) is not signal.SIG_IGN  # (this process untouched)
