"""Runs that survive, against real processes: a worker SIGKILLed mid-epoch, Redis restarted."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.stack import Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def launch(session: Any, stack: Stack, **fields: Any) -> int:
    response = session.post(f"{stack.base_url}/api/experiments/", json=fields, timeout=10)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def row(stack: Stack, pk: int) -> dict[str, Any]:
    ((status, attempt, attempts, error),) = stack.query(
        "SELECT status, attempt, attempts, error FROM experiments_experiment WHERE id = ?", pk
    )
    return {"status": status, "attempt": attempt, "attempts": json.loads(attempts), "error": error}


def points(stack: Stack, pk: int) -> list[tuple[str, int]]:
    """(key, step) of the stored train loss and test accuracy points, in the order stored."""
    return [
        (key, step)
        for key, step in stack.query(
            "SELECT key, step FROM experiments_seriespoint WHERE experiment_id = ?"
            " AND key IN ('train_loss', 'test_accuracy') ORDER BY id",
            pk,
        )
    ]


def assert_history_whole(history: list[tuple[str, int]], *, epochs: int) -> None:
    """Steps rise without repeats, and there is one evaluation per epoch."""
    train_steps = [step for key, step in history if key == "train_loss"]
    assert train_steps == sorted(set(train_steps)), f"repeated or unordered steps: {train_steps}"
    evaluations = [step for key, step in history if key == "test_accuracy"]
    assert len(evaluations) == epochs and evaluations == sorted(set(evaluations)), evaluations


def test_a_killed_worker_is_noticed_and_the_run_resumes(stack: Stack) -> None:
    alice = stack.login("alice")
    pk = launch(alice, stack, name="survivor", strategy="ddp", processes=2, epochs=3)
    wait_for(
        lambda: stack.query(
            "SELECT 1 FROM experiments_logline WHERE experiment_id = ? AND message LIKE ?",
            pk,
            "checkpoint of epoch 1 %",
        ),
        timeout=180,
        what="the first checkpoint",
    )
    time.sleep(1.5)  # mid-epoch 2
    killed = time.monotonic()
    stack.services["worker"].kill()
    # As systemd or a container runtime would: the worker comes back at once. It finds the
    # run's orphaned processes, and the reaper it runs notices the silence.
    stack.worker_start()
    wait_for(lambda: row(stack, pk)["attempts"], timeout=60, what="the run to be lost")
    lost_after = time.monotonic() - killed
    wait_for(lambda: row(stack, pk)["attempt"] == 2, timeout=120, what="the second attempt")
    resumed_after = time.monotonic() - killed
    final = wait_for(
        lambda: (r := row(stack, pk))["status"] in {"succeeded", "failed"} and r,
        timeout=240,
        what="the resumed run to end",
    )
    print(f"worker SIGKILL to lost: {lost_after:.1f} s; to resumed attempt: {resumed_after:.1f} s")
    assert final["status"] == "succeeded", final["error"] + stack.diagnostics()
    assert [a["outcome"] for a in final["attempts"]] == ["lost", "succeeded"]
    assert_history_whole(points(stack, pk), epochs=3)
    resumed_log = stack.query(
        "SELECT message FROM experiments_logline WHERE experiment_id = ? AND message LIKE ?",
        pk,
        "%resum%",
    )
    assert resumed_log, "the resumed attempt should say it resumed"


# sqlite_only: Redis is what goes down; the points the socket backfills are read as stored, on
# either engine alike.
@pytest.mark.sqlite_only
def test_redis_restart_loses_no_point_and_the_socket_backfills(stack: Stack) -> None:
    alice = stack.login("alice")
    pk = launch(alice, stack, name="through an outage", strategy="ddp", processes=2, epochs=2)
    seen: set[tuple[str, int]] = set()  # (key, step) of the points the client has
    reconnects, restarted, final = 0, False, None
    deadline = time.monotonic() + 300
    while final is None and time.monotonic() < deadline:
        try:
            headers = {
                "Origin": stack.base_url,
                "Cookie": f"sessionid={alice.cookies['sessionid']}",
            }
            with connect(f"{stack.ws_url}/ws/experiments/{pk}/", additional_headers=headers) as ws:
                while final is None:
                    message = json.loads(ws.recv(timeout=60))
                    if message["type"] == "snapshot":
                        # A short run's series come one bucket per point.
                        seen.update(
                            (key, bucket[0])
                            for key in ("train_loss", "test_accuracy")
                            for bucket in message["series"].get(key, {}).get("buckets", [])
                        )
                    elif message["type"] == "step":
                        seen.add(("train_loss", message["step"]))
                    elif message["type"] == "epoch":
                        seen.add(("test_accuracy", message["step"]))
                    elif message["type"] in {"finished", "failed"}:
                        final = message
                    if not restarted and seen:
                        restarted = True
                        stack.redis_restart(down_seconds=4)
        except (ConnectionClosed, OSError, TimeoutError):
            reconnects += 1
            time.sleep(min(8, 0.5 * 2**reconnects))
    assert final is not None and final["status"] == "succeeded", stack.diagnostics()
    stored = points(stack, pk)
    assert_history_whole(stored, epochs=2)
    print(f"points stored {len(stored)}, seen by the socket client {len(seen)}, "
          f"reconnects {reconnects}")  # fmt: skip
    assert reconnects >= 1
    assert seen == set(stored), "the client's curve has a hole"
    # The worker rode the outage out (Celery 5.7.0's did not where a message was prefetched
    # when Redis went down: it logged this, exited after the run, and no launch started again).
    worker = stack.services["worker"]
    log = worker.log_path.read_text(errors="replace")
    assert "Unrecoverable error" not in log, stack.diagnostics()
    assert worker.process.poll() is None, stack.diagnostics()


def test_runs_started_together_never_share_the_cores(stack: Stack) -> None:
    alice = stack.login("alice")
    first, second = (
        launch(alice, stack, name=f"together {n}", strategy="ddp", processes=2, epochs=1)
        for n in (1, 2)
    )
    waiting = wait_for(
        lambda: stack.query(
            "SELECT id, waiting_reason FROM experiments_experiment"
            " WHERE id IN (?, ?) AND status = 'queued' AND waiting_reason != ''",
            first,
            second,
        ),
        timeout=120,
        what="one of the two runs to wait",
    )
    (_, reason), *_ = waiting
    assert reason.startswith("waiting for 2 CPU cores on test-worker"), reason
    spans = []
    for pk in (first, second):
        # An epoch each, one after the other: over 4 minutes when the other xdist worker trains too.
        wait_for(lambda pk=pk: row(stack, pk)["status"] == "succeeded", timeout=480, what=f"#{pk}")
        ((started, finished),) = stack.query(
            "SELECT started_at, finished_at FROM experiments_experiment WHERE id = ?", pk
        )
        spans.append((started, finished))
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    assert a_end <= b_start, f"the two runs overlapped: {spans}"
