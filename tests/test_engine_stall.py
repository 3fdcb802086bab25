"""The engine's own torchrun runs watched for stalls (issue 33 item 3; training/observe/
rank_watch.py), without the dashboard: a real DDP run on two Gloo ranks whose rank 1 the test
stops (SIGSTOP: a process that lives and makes no step, as a rank hung in C++ does) is said
stalled by rank 0's watch, naming who waits in which collective; continued, its steps end the
stall. The dashboard's side, with Stop and resume: tests/test_script_stack.py's engine test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.test_training import _env, _kill_tree

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent
FLOOR = 2  # TRAINYARD_STALL_SECONDS: a stall past 2 s (the watch's own default is 60)


def events_of(proc: subprocess.Popen[str]) -> Iterator[dict[str, Any]]:
    assert proc.stdout is not None
    for line in proc.stdout:
        yield json.loads(line)


def next_of(events: Iterator[dict[str, Any]], type_: str) -> dict[str, Any]:
    return next(e for e in events if e["type"] == type_)


def test_a_stopped_rank_of_an_engine_run_is_said_stalled_and_its_steps_end_it(
    sample_data: Path, tmp_path: Path
) -> None:
    env = _env(sample_data) | {"TRAINYARD_STALL_SECONDS": str(FLOOR), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "training", "--strategy", "ddp", "--nproc", "2", "--dry-run",
         "--epochs", "1000", "--run-id", "hung"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    drain.start()
    try:
        events = events_of(proc)
        rank1 = next_of(events, "started")["pids"][1]
        for _ in range(3):
            next_of(events, "step")
        os.kill(rank1, signal.SIGSTOP)
        stopped = time.monotonic()
        stalled = next_of(events, "stalled")
        said_after = time.monotonic() - stopped
        os.kill(rank1, signal.SIGCONT)
        over = next_of(events, "stalled")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    except BaseException:
        os.kill(rank1, signal.SIGCONT)
        _kill_tree(proc)
        raise
    drain.join(10)
    # Within the bound, max(the floor, 10 median steps), and the stacks' wait of 3 s: well before
    # the watch's own floor of a minute, which it would otherwise have gone by.
    assert said_after < 45, "".join(stderr)[-3000:]
    assert stalled["since"] is not None and stalled["text"].startswith("No step for ")
    waiting, hung = stalled["ranks"]
    assert (waiting["rank"], hung["rank"]) == (0, 1)
    # Rank 0 waits in a collective rank 1 (stopped) never finished: DDP's all-reduce, or the
    # window's gather; its stack names the engine's loop. Rank 1 could not answer.
    assert waiting["entered"] is True and waiting["collective"].split(" #")[0] in {
        "all_reduce", "all_gather", "allgather_coalesced", "broadcast",
    }, waiting  # fmt: skip
    assert "rank 0 waits in" in waiting["line"], waiting["line"]
    assert "training/engine.py" in waiting["stack"], waiting["stack"]
    assert hung["stack"] == "(no stack: the process did not answer)"
    assert over["since"] is None and "steps again" in over["text"], over
    # The machine's records went with the run (rank 0 removed their folder).
    assert not list(tmp_path.glob("trainyard-progress-*"))
    assert not psutil.pid_exists(rank1) or psutil.Process(rank1).status() == psutil.STATUS_ZOMBIE
