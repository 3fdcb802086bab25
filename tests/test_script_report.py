"""Scripts run elsewhere report in (issue 32, item 5): `trainyard.init(url=...)` outside a
Trainyard launch creates a run through the API and posts its ranks' events in batches; each
event is stored once whatever the retries, a spool keeps what the server did not take, and
`trainyard sync` sends a spool left offline.

The API's rules in-process first (refusals, idempotence, the run's end, silence); then one live
test through the stack: a two-rank torchrun script with TRAINYARD_URL posts while the web server
is stopped and started again, and a spool written with the server unreachable is synced twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.api import MAX_BODY_BYTES
from dashboard.experiments.core.limits import launch_active_check
from dashboard.experiments.core.reported import MAX_EVENTS_PER_POST
from dashboard.experiments.models import Checkpoint, Experiment, LogLine, SeriesPoint
from dashboard.experiments.scheduling.queue import running_by_owner
from dashboard.serving import daphne_command, free_port, port_open
from tests.factories import logged_in
from tests.stack import ROOT, Stack, service_start, wait_for

REPORT = "/api/experiments/report/"


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, json.dumps(body), content_type="application/json")


def reported(client: Client, *, key: str = "key-0123456789", processes: int = 2) -> int:
    response = post(client, REPORT, {"key": key, "name": "elsewhere", "processes": processes})
    assert response.status_code in {200, 201}, response.content
    return int(response.json()["id"])


def metrics(rank: int, seq: int, step: int, loss: float) -> dict[str, Any]:
    return {"v": 1, "minor": 11, "run": "k", "type": "metrics", "time": 0.5, "rank": rank,
            "seq": seq, "step": step, "values": {"loss": loss}}  # fmt: skip


def events_url(pk: int) -> str:
    return f"/api/experiments/{pk}/events/"


# ---- the API, in-process ----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_reported_run_is_created_once_per_key_running_and_never_queued(alice: Any) -> None:
    client = logged_in(alice)
    first = post(client, REPORT, {"key": "abcdef0123", "name": "on my laptop", "processes": 4})
    assert first.status_code == 201, first.content
    again = post(client, REPORT, {"key": "abcdef0123", "name": "on my laptop", "processes": 4})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    run = first.json()
    assert (run["status"], run["strategy"], run["processes"]) == ("running", "script", 4)
    assert run["reported"] is True and run["last_heard_at"] and run["silence_text"] == ""
    row = Experiment.objects.get(pk=run["id"])
    assert row.heartbeat_at is None and row.worker == "" and row.attempt == 1
    for body in ({"key": "short"}, {"key": "abcdef0123", "processes": 0},
                 {"key": "abcdef0123", "name": ""}, {"key": "abcdef0123", "what": 1}):  # fmt: skip
        assert post(client, REPORT, body).status_code == 400, body


@pytest.mark.django_db
def test_only_the_runs_owner_may_post_its_events(user_factory: Any, alice: Any) -> None:
    pk = reported(logged_in(alice))
    body = {"events": [metrics(0, 1, 1, 0.5)]}
    for other in (user_factory(username="bob"), user_factory(username="root", staff=True)):
        assert post(logged_in(other), events_url(pk), body).status_code == 404
    assert post(Client(), events_url(pk), body).status_code == 401
    launched = Experiment.objects.create(owner=alice, name="launched", status="running")
    assert post(logged_in(alice), events_url(launched.pk), body).status_code == 409
    assert not SeriesPoint.objects.exists()


BAD_BODIES = [
    ({"events": "many"}, '{"events": [...]}'),
    ({"events": [{**metrics(0, 1, 1, 0.5), "type": "step"}]}, "`type` must be one of"),
    # Only a Trainyard launch watches its ranks from outside (protocol 1.13).
    ({"events": [{"type": "stalled", "rank": 0, "seq": 1, "since": 1.0, "ranks": [], "text": ""}]},
     "`type` must be one of"),
    ({"events": [metrics(2, 1, 1, 0.5)]}, "`rank` must be a whole number below the run's 2"),
    ({"events": [metrics(0, 0, 1, 0.5)]}, "`seq` must be a whole number from 1"),
    ({"events": [metrics(0, 2, 1, 0.5), metrics(1, 1, 1, 0.5), metrics(0, 2, 2, 0.5)]},
     "events[2]: rank 0's events must come in seq order"),
    ({"events": [{**metrics(0, 1, 1, 0.5), "values": {"loss": "low"}}]}, "must be a number"),
    ({"events": [{**metrics(0, 1, -1, 0.5)}]}, "`step` must be a whole number"),
    ({"events": [{"type": "log", "rank": 0, "seq": 1, "message": 3}]}, "`message` must be"),
    ({"events": [metrics(0, n, n, 0.5) for n in range(1, MAX_EVENTS_PER_POST + 2)]},
     f"at most {MAX_EVENTS_PER_POST} a request"),
]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "reason"), BAD_BODIES)
def test_a_bad_body_is_refused_with_its_reason_and_nothing_is_stored(
    alice: Any, body: dict[str, Any], reason: str
) -> None:
    client = logged_in(alice)
    pk = reported(client)
    response = post(client, events_url(pk), {"events": [metrics(0, 1, 1, 0.5)], **body})
    assert response.status_code == 400, response.content
    assert reason in response.json()["error"]
    assert not SeriesPoint.objects.exists() and not LogLine.objects.exists()


@pytest.mark.django_db
def test_a_body_over_the_bound_is_refused(alice: Any) -> None:
    client = logged_in(alice)
    pk = reported(client)
    big = {"events": [{"type": "log", "rank": 0, "seq": 1, "message": "x" * MAX_BODY_BYTES}]}
    assert post(client, events_url(pk), big).status_code == 413


@pytest.mark.django_db
def test_the_same_batch_twice_is_stored_once_and_counted_as_duplicates(alice: Any) -> None:
    client = logged_in(alice)
    pk = reported(client)
    batch = {"events": [metrics(rank, seq, seq, 1.0 / seq) for seq in (1, 2, 3) for rank in (0, 1)]}
    first = post(client, events_url(pk), batch).json()
    assert first == {"stored": 6, "duplicates": 0, "stop": False, "checkpoint": 0}
    assert post(client, events_url(pk), batch).json()["duplicates"] == 6
    # A retry that overlaps what was stored and goes further stores the new part alone.
    more = {"events": [metrics(0, seq, seq, 0.1) for seq in (2, 3, 4)]}
    assert post(client, events_url(pk), more).json() | {"stop": 0} == {
        "stored": 1, "duplicates": 2, "stop": 0, "checkpoint": 0}  # fmt: skip
    keys = SeriesPoint.objects.filter(experiment_id=pk).values_list("key", "step")
    assert sorted(keys) == sorted(
        [("loss", s) for s in (1, 2, 3, 4)]
        + [("rank/0/loss", s) for s in (1, 2, 3, 4)]
        + [("rank/1/loss", s) for s in (1, 2, 3)]
    )
    # hello, stopping and done are the launcher's words: counted in order, stored as nothing.
    quiet = {"events": [{"type": "hello", "rank": 1, "seq": 4, "pid": 1}]}
    assert post(client, events_url(pk), quiet).json()["stored"] == 1
    assert SeriesPoint.objects.filter(experiment_id=pk).count() == 11


@pytest.mark.django_db
def test_rank_0s_done_ends_the_run_and_a_checkpoint_is_a_line_not_a_file(alice: Any) -> None:
    client = logged_in(alice)
    pk = reported(client)
    events = [
        {"type": "checkpoint", "rank": 0, "seq": 1, "epoch": 0, "step": 7, "path": "/far/c.pt"},
        {"type": "log", "rank": 1, "seq": 1, "level": "warning", "message": "slow disk"},
        {"type": "done", "rank": 1, "seq": 2, "step": 7, "stopped": False},
    ]  # fmt: skip
    post(client, events_url(pk), {"events": events})
    assert Experiment.objects.get(pk=pk).status == "running"  # rank 1's end is not the run's
    assert not Checkpoint.objects.filter(experiment_id=pk).exists()
    lines = dict(LogLine.objects.filter(experiment_id=pk).values_list("rank", "message"))
    assert "/far/c.pt (not kept here)" in lines[0] and lines[1] == "slow disk"
    post(client, events_url(pk), {"events": [{"type": "done", "rank": 0, "seq": 2, "step": 7}]})
    assert Experiment.objects.get(pk=pk).status == "succeeded"


@pytest.mark.django_db
def test_a_stop_is_answered_then_agreed_and_a_failure_fails_the_run(alice: Any) -> None:
    client = logged_in(alice)
    pk = reported(client)
    assert client.post(f"/api/experiments/{pk}/stop/").status_code == 202
    answer = post(client, events_url(pk), {"events": []}).json()
    assert answer["stop"] is True and Experiment.objects.get(pk=pk).status == "running"
    done = {"type": "done", "rank": 0, "seq": 1, "step": 3, "stopped": True}
    assert post(client, events_url(pk), {"events": [done]}).json()["stop"] is False
    assert Experiment.objects.get(pk=pk).status == "cancelled"

    failing = reported(client, key="failing-0123")
    failed = {"type": "failed", "rank": 1, "seq": 5, "error": "ValueError: bad batch",
              "traceback": "Traceback (most recent call last):\nValueError: bad batch"}  # fmt: skip
    post(client, events_url(failing), {"events": [failed]})
    row = Experiment.objects.get(pk=failing)
    assert (row.status, row.error) == ("failed", "rank 1: ValueError: bad batch")
    assert row.logs.filter(level="error", rank=1, message__startswith="Traceback").exists()


@pytest.mark.django_db
def test_a_reported_run_holds_no_worker_so_it_counts_against_no_limit(
    alice: Any, settings: Any
) -> None:
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 1
    reported(logged_in(alice))
    assert launch_active_check(owner=alice) is None
    assert running_by_owner()[alice.pk] == 0


@pytest.mark.django_db
def test_a_silent_run_says_so_and_a_stop_ends_it_at_once(alice: Any, settings: Any) -> None:
    client = logged_in(alice)
    pk = reported(client)
    Experiment.objects.filter(pk=pk).update(last_heard_at=timezone.now() - timedelta(minutes=3))
    run = client.get(f"/api/experiments/{pk}/").json()
    assert run["silence_text"].startswith("Not heard from for 3m 0")
    page = client.get(f"/experiments/{pk}/").content.decode()
    assert 'id="silence-box"' in page and "Not heard from for 3m" in page
    post(client, events_url(pk), {"events": []})  # a post is a sign of life
    assert client.get(f"/api/experiments/{pk}/").json()["silence_text"] == ""
    Experiment.objects.filter(pk=pk).update(last_heard_at=timezone.now() - timedelta(minutes=3))
    assert client.post(f"/api/experiments/{pk}/stop/").status_code == 202
    assert Experiment.objects.get(pk=pk).status == "cancelled"


# ---- live, through the stack ------------------------------------------------------------------

# A user's script as it would run by hand on another machine: plain torchrun (or plain python),
# the trainyard library told of the server by its environment alone. It logs one figure a step
# until --steps, or (0) until the file --until names exists, which its ranks agree on.
SCRIPT = textwrap.dedent(
    """
    import argparse, os, time
    import torch
    import torch.distributed as dist
    import trainyard

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--until", default="")
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    run = trainyard.init(name="reported " + str(args.steps))
    step = 0
    while step < args.steps or not args.steps:
        step += 1
        run.log({"loss": 1.0 / step}, step=step)
        time.sleep(0.05)
        if not args.steps:
            done = torch.tensor([int(os.path.exists(args.until))])
            if dist.is_initialized():
                dist.all_reduce(done, op=dist.ReduceOp.MAX)
            if done.item():
                break
    print(f"last step {step}", flush=True)
    run.finish()
    """
)


def web_restart(stack: Stack, *, down_seconds: float) -> None:
    """The web server stopped, then started again on its port (the database and Redis stay)."""
    stack.services["web"].stop()
    time.sleep(down_seconds)
    port = int(stack.base_url.rsplit(":", 1)[1])
    stack.services["web"] = service_start(
        name="web", command=daphne_command(port=port), env=stack.env, logs=stack.logs
    )
    wait_for(lambda: port_open(port), timeout=60, what="daphne again")


def points(stack: Stack, name: str) -> dict[str, list[int]]:
    """The steps stored under each key of the reported run called `name`, as rows."""
    rows = stack.query(
        "SELECT p.key, p.step FROM experiments_seriespoint p JOIN experiments_experiment e "
        "ON p.experiment_id = e.id WHERE e.name = ? AND e.reported ORDER BY p.step",
        name,
    )
    found: dict[str, list[int]] = {}
    for key, step in rows:
        found.setdefault(key, []).append(step)
    return found


def status_of(stack: Stack, name: str) -> str:
    return str(stack.query("SELECT status FROM experiments_experiment WHERE name = ?", name)[0][0])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_script_elsewhere_loses_nothing_when_the_server_restarts_and_syncs_later(
    stack: Stack, tmp_path: Path
) -> None:
    token = stack.manage("create_token", "alice").strip()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAINYARD_URL": stack.base_url,
           "TRAINYARD_TOKEN": token, "TRAINYARD_SPOOL_DIR": str(tmp_path / "spool")}  # fmt: skip
    (tmp_path / "train.py").write_text(SCRIPT)
    flag = tmp_path / "enough"
    live = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "train.py", "--until", str(flag)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its ranks are ended with it where the test fails midway
    )  # fmt: skip
    try:
        # Points arrive; the server goes away while the ranks go on; it comes back.
        wait_for(lambda: len(points(stack, "reported 0").get("rank/1/loss", [])) > 5,
                 timeout=120, what="the first points")  # fmt: skip
        web_restart(stack, down_seconds=3)
        before = len(points(stack, "reported 0")["loss"])
        wait_for(lambda: len(points(stack, "reported 0")["loss"]) > before + 20, timeout=60,
                 what="the points kept while the server was away")  # fmt: skip
        flag.touch()
        out, err = live.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(live.pid, signal.SIGKILL)
    assert live.returncode == 0, err
    last = int(out.split("last step ")[-1].split()[0])
    wait_for(lambda: status_of(stack, "reported 0") == "succeeded", timeout=30, what="the end")
    every = list(range(1, last + 1))
    assert points(stack, "reported 0") == {"loss": every, "rank/0/loss": every,
                                           "rank/1/loss": every}  # fmt: skip
    assert "not sent" not in err and not any((tmp_path / "spool").iterdir())

    # A run whose server could never be reached: its spool waits, then `trainyard sync` sends it.
    offline = {**env, "TRAINYARD_URL": f"http://127.0.0.1:{free_port()}",
               "TRAINYARD_FINISH_SECONDS": "1"}  # fmt: skip
    ran = subprocess.run(  # noqa: S603
        [sys.executable, "train.py", "--steps", "30"], cwd=tmp_path, env=offline,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0 and "Send them with:" in ran.stderr, ran.stderr
    folder = ran.stderr.split("trainyard sync ")[-1].split()[0]
    sync = [sys.executable, "-m", "trainyard", "sync", folder, "--url", stack.base_url,
            "--token", token]  # fmt: skip
    first = subprocess.run(sync, env=env, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
    assert first.returncode == 0 and "32 event(s) stored, 0" in first.stdout, first
    assert points(stack, "reported 30")["loss"] == list(range(1, 31))
    assert status_of(stack, "reported 30") == "succeeded"  # rank 0's done came with the rest
    # Again, having forgotten what was acknowledged: the server has every event already.
    for mark in Path(folder).glob("rank-*.sent"):
        mark.unlink()
    again = subprocess.run(sync, env=env, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
    assert again.returncode == 0 and "0 event(s) stored, 32" in again.stdout, again
    assert points(stack, "reported 30")["rank/0/loss"] == list(range(1, 31))

    # A script that dies of an exception fails its run, with the reason and the traceback.
    failing = "import trainyard\nrun = trainyard.init(name='failing')\nraise ValueError('bad')\n"
    died = subprocess.run(  # noqa: S603
        [sys.executable, "-c", failing], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert died.returncode == 1 and "ValueError: bad" in died.stderr, died.stderr
    (row,) = stack.query("SELECT status, error FROM experiments_experiment WHERE name = 'failing'")
    assert row == ("failed", "rank 0: ValueError: bad")
