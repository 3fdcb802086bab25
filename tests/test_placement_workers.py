"""Placement with real Celery workers: two more workers on this host, each started as a user
starts one (`celery -A dashboard worker`, no -Q) with its own TRAINYARD_WORKER_NAME, each held
to one core. They share the host, which placement does not mind (the namespaces of
tests/test_machines.py are for the job itself): each consumes the shared queue and its own
machine's queue, a pinned run lands on its machine, and two 2-machine runs launched in the same
second take turns, never holding the machines at once, neither stuck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.stack import ROOT, Service, Stack, service_start, wait_for

# postgres_only: several machines share one PostgreSQL (docs/guides/several-machines.md), so
# make test runs these in its PostgreSQL pass; the same claims on SQLite are tests/test_queue.py's.
pytestmark = [pytest.mark.integration, pytest.mark.postgres_only, pytest.mark.timeout(600)]

MACHINES = ("place-a", "place-b")


def placement_worker_start(stack: Stack, name: str, core: int) -> Service:
    # One core each (its affinity is what the worker reports and the allocation counts): a
    # one-rank node then fills its machine, so two runs cannot both fit.
    command = [
        "taskset", "-c", str(core), sys.executable, "-m", "celery", "-A", "dashboard", "worker",
        "--pool", "prefork", "--concurrency", "2", "--loglevel", "INFO", "-n", f"{name}@%h",
        "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    env = {**stack.env, "TRAINYARD_WORKER_NAME": name}
    return service_start(name=name, command=command, env=env, logs=stack.logs)


def online(stack: Stack, names: tuple[str, ...]) -> bool:
    rows = stack.query("SELECT hostname, address FROM devices_workermachine")
    return set(names) <= {name for name, address in rows if address}


@pytest.fixture(scope="module")
def machines(stack: Stack) -> Iterator[dict[str, Service]]:
    services = {
        name: placement_worker_start(stack, name, core % os.cpu_count())
        for core, name in enumerate(MACHINES)
    }
    try:
        wait_for(lambda: online(stack, MACHINES), timeout=120, what="both workers' reports",
                 interval=0.5)  # fmt: skip
        yield services
    finally:
        for service in services.values():
            service.stop()
        # The stack outlives this module: machines that are gone must not stay "online" for
        # the next modules' placement and queue estimates (the stale bound would keep them).
        stack.manage(
            "shell", "-c",
            "from dashboard.devices.models import WorkerMachine as W;"
            f"W.objects.filter(hostname__in={list(MACHINES)!r}).delete()",
        )  # fmt: skip


def run_row(stack: Stack, pk: int) -> dict[str, Any]:
    ((status, worker, placement, reason),) = stack.query(
        "SELECT status, worker, placement, waiting_reason FROM experiments_experiment WHERE id = ?",
        pk,
    )
    return {"status": status, "worker": worker, "placement": json.loads(placement or "[]"),
            "waiting_reason": reason}  # fmt: skip


def ended(stack: Stack, pk: int, *, timeout: float) -> dict[str, Any]:
    wait_for(lambda: run_row(stack, pk)["status"] in {"succeeded", "failed", "cancelled"},
             timeout=timeout, what=f"run #{pk} to end", interval=0.5)  # fmt: skip
    return run_row(stack, pk)


def queued_run_create(stack: Stack) -> int:
    """A queued one-machine run stored without sending it anywhere: the test sends its task."""
    code = (
        "from dashboard.experiments.models import Experiment as E;"
        "from django.contrib.auth import get_user_model as g;"
        "print(E.objects.create(owner=g().objects.get(username='alice'), name='queue probe',"
        " strategy='single', epochs=1, batch_size=500, processes=1).pk)"
    )
    return int(stack.manage("shell", "-c", code).strip().splitlines()[-1])


def test_each_worker_consumes_its_own_machine_queue(
    stack: Stack, machines: dict[str, Service]
) -> None:
    for name in MACHINES:
        assert f"machine.{name}" in machines[name].log_tail(200), machines[name].log_tail(60)
    # Not the current app: shared tasks (notifications') would then be sent through it, to this
    # stack's broker, by every later test in this process.
    sender = Celery(broker=stack.redis_url, set_as_current=False)
    try:
        for name in MACHINES:
            pk = queued_run_create(stack)
            # Not pinned: whichever worker takes the message claims it, so where it ran says
            # which worker consumed that queue.
            sender.send_task("experiments.run_experiment", args=[pk], queue=f"machine.{name}")
            row = ended(stack, pk, timeout=240)
            assert row["status"] == "succeeded", stack.diagnostics()
            assert row["worker"] == name and [e["worker"] for e in row["placement"]] == [name]
    finally:
        sender.close()


def trainyard(stack: Stack, *args: str, home: Path, stdin: str = "") -> Any:
    return subprocess.run(  # noqa: S603
        [str(Path(sys.executable).parent / "trainyard"), *args],
        cwd=ROOT, env={**os.environ, "XDG_CONFIG_HOME": str(home)}, input=stdin,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_the_client_pins_a_run_and_hears_refusals(
    stack: Stack, machines: dict[str, Service], tmp_path: Path
) -> None:
    login = trainyard(stack, "login", stack.base_url, "--username", "alice", "--password-stdin",
                      home=tmp_path, stdin=stack.passwords["alice"] + "\n")  # fmt: skip
    assert login.returncode == 0, login.stderr
    refused = trainyard(stack, "launch", "--strategy", "hogwild", "--nodes", "2", home=tmp_path)
    assert refused.returncode == 2
    assert "nodes: Hogwild runs on one machine" in refused.stderr, refused.stderr
    pinned = trainyard(stack, "launch", "--strategy", "ddp", "--nproc", "1", "--epochs", "1",
                       "--batch-size", "500", "--machines", "place-b", "--watch",
                       home=tmp_path)  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr + stack.diagnostics()
    pk = int(pinned.stdout.split("#")[1].split()[0])
    read = stack.login("alice").get(f"{stack.base_url}/api/experiments/{pk}/", timeout=20).json()
    assert (read["nodes"], read["machines"], read["worker"]) == (1, ["place-b"], "place-b")
    assert [entry["worker"] for entry in read["placement"]] == ["place-b"]


def test_unknown_and_offline_machines_are_refused_through_the_api(
    stack: Stack, machines: dict[str, Service]
) -> None:
    alice = stack.login("alice")
    response = alice.post(
        f"{stack.base_url}/api/experiments/",
        json={"strategy": "ddp", "processes": 1, "machines": ["place-a", "place-z"]},
        timeout=20,
    )
    assert response.status_code == 400
    (message,) = response.json()["errors"]["machines"]
    assert message.startswith("no worker named place-z: the workers are ")
    assert "place-a" in message and "place-b" in message


def test_two_two_machine_runs_launched_at_once_take_turns(
    stack: Stack, machines: dict[str, Service]
) -> None:
    """Slow (minutes on 2 cores): the two runs train one after the other by design (each a DDP
    epoch over both workers, each worker held to one core), and the second starts only once the
    first has ended and handed the machines on."""
    alice = stack.login("alice")
    ids: list[int] = []
    barrier = threading.Barrier(2)

    def launch(order: list[str]) -> None:
        barrier.wait()
        response = alice.post(
            f"{stack.base_url}/api/experiments/",
            json={
                "strategy": "ddp",
                "processes": 1,
                "epochs": 1,
                "batch_size": 500,
                "machines": order,
            },
            timeout=20,
        )
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])

    # Opposite orders: each run's first machine is the other's second, the case where a claim
    # that locked one machine and waited for the other would deadlock.
    threads = [threading.Thread(target=launch, args=(order,))
               for order in (list(MACHINES), list(reversed(MACHINES)))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(ids) == 2
    seen: list[tuple[str, str]] = []
    reasons: set[str] = set()
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        rows = [run_row(stack, pk) for pk in ids]
        seen.append((rows[0]["status"], rows[1]["status"]))
        reasons |= {row["waiting_reason"] for row in rows if row["waiting_reason"]}
        if all(row["status"] in {"succeeded", "failed", "cancelled"} for row in rows):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"neither deadlock nor stall expected; statuses {seen[-1]}\n"
                    f"{stack.diagnostics()}")  # fmt: skip
    assert ("running", "running") not in seen
    assert [row["status"] for row in rows] == ["succeeded", "succeeded"], stack.diagnostics()
    for row in rows:
        assert sorted(entry["worker"] for entry in row["placement"]) == sorted(MACHINES)
        assert row["placement"][0]["worker"] == row["worker"]
    # The one that waited said why, naming the machines and the run that held them.
    waited = [
        reason for reason in reasons if "waiting for 2 machines with 1 free core each" in reason
    ]
    assert waited, reasons
    assert any(f"busy with #{pk}" in reason for reason in waited for pk in ids), waited
    times = stack.query(
        "SELECT started_at, finished_at FROM experiments_experiment WHERE id IN (?, ?) "
        "ORDER BY started_at",
        *ids,
    )
    (first_start, first_end), (second_start, _) = [
        [datetime.fromisoformat(str(value)) for value in row] for row in times
    ]
    # Each time is read as its transaction begins (the claim's before it waits for the locks,
    # the end's before its update), so they may cross by a few milliseconds; the statuses above
    # are the proof that the runs never held the machines at once.
    assert second_start >= first_end - timedelta(seconds=1)
    handed_on = max(0.0, (second_start - first_end).total_seconds())
    print(f"first run {(first_end - first_start).total_seconds():.1f} s; machines handed on "
          f"{handed_on:.2f} s after it ended")  # fmt: skip
