"""The whole path against real processes: Redis, daphne, a Celery worker and torchrun ranks."""

from __future__ import annotations

import json
import time
from typing import Any

import psutil
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.stack import Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def socket_open(stack: Stack, session: Any, pk: int, *, origin: str | None = None):
    cookie = f"sessionid={session.cookies['sessionid']}" if session is not None else ""
    headers = {"Origin": origin or stack.base_url}
    if cookie:
        headers["Cookie"] = cookie
    return connect(f"{stack.ws_url}/ws/experiments/{pk}/", additional_headers=headers)


def messages_until_final(ws: ClientConnection, *, timeout: float) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=deadline - time.monotonic()))
        received.append(message)
        if message["type"] in {"finished", "failed"}:
            return received
    raise TimeoutError(f"no final message; got {[m['type'] for m in received]}")


def launch(session: Any, stack: Stack, **fields: Any) -> dict[str, Any]:
    response = session.post(f"{stack.base_url}/api/experiments/", json=fields, timeout=10)
    assert response.status_code == 201, response.text
    return response.json()


def test_ddp_run_streams_live_and_succeeds(stack: Stack) -> None:
    alice = stack.login("alice")
    started = time.monotonic()
    run = launch(alice, stack, name="ddp live", strategy="ddp", processes=2, epochs=1)
    assert run["status"] == "queued"
    with socket_open(stack, alice, run["id"]) as ws:
        messages = messages_until_final(ws, timeout=240)
    snapshot, live = messages[0], messages[1:]
    assert snapshot["type"] == "snapshot" and snapshot["experiment"]["id"] == run["id"]
    seqs = [m["seq"] for m in live if m["seq"] > snapshot["seq"]]
    assert seqs == list(range(snapshot["seq"] + 1, snapshot["seq"] + 1 + len(seqs)))
    types = {m["type"] for m in live}
    assert {"started", "step", "epoch", "finished"} <= types, types
    first_step = next(m for m in live if m["type"] == "step")
    assert first_step["train_loss"] > 0 and first_step["images_per_second"] > 0
    assert messages[-1]["status"] == "succeeded", stack.diagnostics()
    print(f"start to final message: {time.monotonic() - started:.1f} s")

    detail = alice.get(f"{stack.base_url}/api/experiments/{run['id']}/", timeout=10).json()
    assert detail["status"] == "succeeded"
    assert detail["worker"] == "test-worker"
    assert detail["test_accuracy"] > 0.8, detail
    # A one-machine run's placement lists its ranks too (it said "ranks": []).
    assert [(p["worker"], p["ranks"]) for p in detail["placement"]] == [("test-worker", [0, 1])]
    # What each rank held at the epoch's end (protocol 1.7): DDP's full copy on both.
    memory = detail["memory"]
    assert [m["rank"] for m in memory] == [0, 1], memory
    assert memory[0]["parameter_bytes"] == memory[1]["parameter_bytes"] > 6_000_000
    # Adam: two moments a parameter, and a step count a tensor.
    assert all(
        2 * m["parameter_bytes"] <= m["optimizer_state_bytes"] < 2 * m["parameter_bytes"] + 1024
        for m in memory
    ), memory
    assert all(m["peak_bytes"] > m["parameter_bytes"] for m in memory)
    metrics = alice.get(f"{stack.base_url}/api/experiments/{run['id']}/metrics/", timeout=10)
    series = metrics.json()["series"]
    assert any(b[7] is not None for b in series["train_loss"]["buckets"])
    evaluations = series["test_accuracy"]["buckets"]
    assert len(evaluations) == 1 and evaluations[0][7] == detail["test_accuracy"]
    # Every series a DDP run reports: the learning rate, rank 0's figures, each rank's, and the
    # worker's CPU as the supervisor sampled it (also sent live as `series` messages).
    for figure in ("images_per_second", "data_seconds", "compute_seconds", "rss_bytes"):
        assert {f"rank/0/{figure}", f"rank/1/{figure}", figure} <= series.keys(), series.keys()
    assert series["lr"]["buckets"][0][7] == run["lr"]
    assert series["machine/test-worker/cpu_percent"]["count"] >= 1
    samples = [m for m in live if m["type"] == "series"]
    assert samples and "machine/test-worker/cpu_percent" in samples[0]["points"]


def test_stopping_a_ddp_run_ends_every_process(stack: Stack) -> None:
    alice = stack.login("alice")
    run = launch(alice, stack, name="to stop", strategy="ddp", processes=2, epochs=20)
    row = wait_for(
        lambda: (r := stack.experiment_row(run["id"]))["run_info"].get("pids") and r,
        timeout=120,
        what="the run's started event",
    )
    launcher = psutil.Process(row["launcher_pid"])
    pids = {launcher.pid, *row["run_info"]["pids"], *(c.pid for c in launcher.children(True))}
    assert len(pids) >= 3  # torchrun and two ranks

    asked = time.monotonic()
    response = alice.post(f"{stack.base_url}/api/experiments/{run['id']}/stop/", timeout=10)
    assert response.status_code == 202, response.text
    wait_for(
        lambda: not [p for p in pids if psutil.pid_exists(p) and not _zombie(p)],
        timeout=10,
        what=f"processes {pids} to end",
        interval=0.05,
    )
    gone_after = time.monotonic() - asked
    print(f"stop request to last process gone: {gone_after:.2f} s")
    assert gone_after < 5
    final = wait_for(
        lambda: (r := stack.experiment_row(run["id"]))["status"] != "running" and r,
        timeout=10,
        what="the cancelled status",
    )
    assert final["status"] == "cancelled"
    detail = alice.get(f"{stack.base_url}/api/experiments/{run['id']}/", timeout=10).json()
    assert detail["cancelled_by"] == "alice" and "alice" in detail["error"]


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_other_users_cannot_see_stop_or_subscribe(stack: Stack) -> None:
    alice, bob = stack.login("alice"), stack.login("bob")
    (row,) = stack.query("SELECT id FROM auth_user WHERE username = 'alice'")
    pk = launch(alice, stack, name="private", strategy="single", epochs=1)["id"]
    assert bob.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=10).status_code == 404
    assert bob.post(f"{stack.base_url}/api/experiments/{pk}/stop/", timeout=10).status_code == 404
    listed = bob.get(f"{stack.base_url}/api/experiments/", timeout=10).json()["experiments"]
    assert pk not in {e["id"] for e in listed}
    for session, origin in ((bob, None), (None, None), (alice, "http://evil.example")):
        with pytest.raises(InvalidStatus), socket_open(stack, session, pk, origin=origin):
            pass
    root = stack.login("root")
    assert root.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=10).status_code == 200
    with socket_open(stack, alice, pk) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "snapshot"
    assert row


def _requested_checkpoint_event(ws: ClientConnection, *, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=deadline - time.monotonic()))
        assert message["type"] not in {"finished", "failed"}, message
        if message["type"] == "checkpoint" and message.get("requested"):
            return message
    raise TimeoutError("no requested checkpoint")


# sqlite_only: the request is one conditional update of the run's row, test_checkpoint_requests'
# on both engines in process; here the engine's answer to it and the file it writes.
@pytest.mark.sqlite_only
def test_checkpoint_now_writes_one_mid_epoch(stack: Stack) -> None:
    alice = stack.login("alice")
    run = launch(alice, stack, name="checkpoint now", strategy="ddp", processes=2, epochs=3)
    api = f"{stack.base_url}/api/experiments/{run['id']}"
    with socket_open(stack, alice, run["id"]) as ws:
        wait_for(
            lambda: stack.experiment_row(run["id"])["status"] == "running",
            timeout=120,
            what="the run to start",
        )
        # Asked while the ranks still import torch: the request waits for the started event.
        assert alice.post(f"{api}/checkpoint/", timeout=10).status_code == 202
        first = _requested_checkpoint_event(ws, timeout=120)
        # Asked while training: written after the current step.
        asked = time.monotonic()
        assert alice.post(f"{api}/checkpoint/", timeout=10).status_code == 202
        second = _requested_checkpoint_event(ws, timeout=60)
        print(f"checkpoint request to checkpoint event, training: {time.monotonic() - asked:.2f} s")
    assert first["step"] < second["step"]
    assert second["url"].endswith(f"/checkpoints/{second['step']}/")

    download = alice.get(stack.base_url + second["url"], timeout=30)
    assert download.status_code == 200, (download.text[:300], second)
    assert len(download.content) == second["size"] > 100_000
    detail = alice.get(f"{api}/", timeout=10).json()
    assert detail["checkpoint_requested"] is False  # passed on, and cleared
    assert alice.post(f"{api}/stop/", timeout=10).status_code == 202
    wait_for(
        lambda: stack.experiment_row(run["id"])["status"] == "cancelled",
        timeout=30,
        what="the cancelled status",
    )
    refused = alice.post(f"{api}/checkpoint/", timeout=10)
    assert refused.status_code == 409 and "cancelled" in refused.json()["error"]
