"""A node's part of a multi-node run, in process against the real database: which processes it
may signal, and who settles the run how (nodes.py). The namespaces of tests/test_machines.py
share one PID namespace and cannot tell a PID of another machine from one of this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import psutil
import pytest
from django import db
from django.utils import timezone

from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, RunNode, Status
from dashboard.experiments.runs.lifecycle import run_finish
from dashboard.experiments.runs.nodes import node_beat, node_peers, pids_on_machine
from dashboard.experiments.runs.runner import (
    RunSupervisor,
    experiments_stop_for_worker_shutdown,
)
from dashboard.experiments.runs.sink import EventSink

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINT = "10.0.0.1:29400"
PLACEMENT = [
    {"worker": "host-a", "node_rank": 0, "ranks": [], "rdzv_endpoint": ENDPOINT},
    {"worker": "host-b", "node_rank": 1, "ranks": [], "rdzv_endpoint": ENDPOINT},
]


def two_machine_run(experiment_factory: Any, user_factory: Any, **fields: Any) -> Experiment:
    fields = {"status": Status.RUNNING, "attempt": 1, "nodes": 2, "processes": 1, **fields}
    return experiment_factory(owner=user_factory(), worker="host-a", placement=PLACEMENT, **fields)


def node(run: Experiment, node_rank: int) -> RunSupervisor:
    run = Experiment.objects.get(pk=run.pk)
    run.worker = PLACEMENT[node_rank]["worker"]  # as experiment_node_supervise does
    return RunSupervisor(experiment=run, sink=EventSink(run), node_rank=node_rank)


def event_line(seq: int, type_: str, **fields: Any) -> str:
    return json.dumps({"v": 1, "run": "", "seq": seq, "type": type_, "time": 1.0, **fields})


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_only_this_machines_ranks_pids_are_kept() -> None:
    machines = ["host-b", "host-a", "host-b"]
    assert pids_on_machine(pids=[11, 22, 33], machines=machines, machine="host-a") == [22]
    assert pids_on_machine(pids=[11, 22, 33], machines=machines, machine="host-b") == [11, 33]
    assert pids_on_machine(pids=[11, 22], machines=None, machine="host-a") == []


def test_a_node_signals_only_its_own_machines_ranks(
    experiment_factory: Any, user_factory: Any
) -> None:
    run = two_machine_run(experiment_factory, user_factory)
    supervisor = node(run, 1)
    supervisor.line_take("stdout", event_line(1, "started", pids=[101, 202],
                                              machines=["host-a", "host-b"]))  # fmt: skip
    assert supervisor.state.rank_pids == [202]


def test_a_worker_shutting_down_leaves_another_machines_pids_alone(
    experiment_factory: Any, user_factory: Any
) -> None:
    launcher, stranger = sleeper(), sleeper()  # `stranger`: a PID a rank on host-b also has
    try:
        info = {"pids": [stranger.pid, launcher.pid], "machines": ["host-b", "host-a"]}
        run = two_machine_run(experiment_factory, user_factory, launcher_pid=launcher.pid,
                              run_info=info)  # fmt: skip
        assert experiments_stop_for_worker_shutdown(worker="host-a") == [run.pk]
        assert launcher.wait(timeout=10) is not None
        assert stranger.poll() is None and psutil.pid_exists(stranger.pid)
    finally:
        for process in (launcher, stranger):
            process.kill()
            process.wait()


def node_ended(run: Experiment, node_rank: int, *, returncode: int, error: str = "") -> None:
    now = timezone.now()
    RunNode.objects.create(experiment=run, attempt=run.attempt, node_rank=node_rank,
                           worker=PLACEMENT[node_rank]["worker"], started_at=now, heartbeat_at=now,
                           ended_at=now, returncode=returncode, error=error)  # fmt: skip


@pytest.fixture
def quick_bound(settings: Any) -> None:
    settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS = 3.0  # heartbeat_interval(): 0.5 s


@pytest.mark.usefixtures("quick_bound")
def test_a_failure_before_started_is_settled_by_the_node_that_had_rank_0(
    experiment_factory: Any, user_factory: Any
) -> None:
    run = two_machine_run(experiment_factory, user_factory)
    node_ended(run, 0, returncode=1, error="training exited with code 1")
    supervisor = node(run, 1)  # rank 0 landed here and failed before `started`
    supervisor.line_take("stdout", event_line(1, "failed", error="no checkpoint to resume from"))
    outcome = supervisor.outcome(1)
    assert outcome is not None and outcome.status == Status.FAILED
    assert "no checkpoint to resume from" in outcome.error and "host-a (node 0)" in outcome.error


@pytest.mark.usefixtures("quick_bound")
def test_a_failure_without_any_event_is_settled_by_node_0(
    experiment_factory: Any, user_factory: Any
) -> None:
    run = two_machine_run(experiment_factory, user_factory)
    node_ended(run, 1, returncode=1, error="rendezvous timed out")
    outcome = node(run, 0).outcome(1)
    assert outcome is not None and outcome.status == Status.FAILED
    assert "rendezvous timed out" in outcome.error


@pytest.mark.usefixtures("quick_bound")
def test_a_stop_just_after_finished_keeps_the_result_rank_0s_node_settles(
    experiment_factory: Any, user_factory: Any
) -> None:
    run = two_machine_run(experiment_factory, user_factory)
    first = node(run, 0)  # rank 0 is on node 1: node 0 never sees `finished`
    first.state.stopped_by = "alice"
    seen: list[Outcome | None] = []

    def node_0_ends() -> None:
        seen.append(first.outcome(-15))
        db.connection.close()

    thread = threading.Thread(target=node_0_ends)
    thread.start()
    second = node(run, 1)
    second.line_take("stdout", event_line(1, "finished", test_loss=0.2, test_accuracy=0.9))
    second.state.stopped_by = "alice"
    outcome = second.outcome(-15)
    assert outcome is not None and outcome.status == Status.SUCCEEDED
    assert run_finish(experiment=second.experiment, sink=second.sink, outcome=outcome)
    thread.join(timeout=30)
    assert seen == [None]
    assert Experiment.objects.get(pk=run.pk).status == Status.SUCCEEDED


@pytest.mark.usefixtures("quick_bound")
def test_a_node_without_rank_0_that_exits_0_ended_well(
    experiment_factory: Any, user_factory: Any
) -> None:
    run = two_machine_run(experiment_factory, user_factory)
    second = node(run, 1)
    node_beat(experiment=second.experiment, node_rank=1, worker="host-b", launcher_pid=1)
    second.state.returncode = 0
    assert second.outcome(0) is None  # rank 0's node settles
    assert RunNode.objects.get(experiment=run, node_rank=1).returncode == 0
    # Rank 0's node, still writing its last checkpoint, sees no failed peer to end itself for.
    assert node_peers(experiment=node(run, 0).experiment, node_rank=0).failed == []


def test_a_node_whose_task_has_not_started_is_given_until_its_machine_would_be_offline(
    experiment_factory: Any, user_factory: Any, settings: Any
) -> None:
    from datetime import timedelta

    from dashboard.experiments.runs.nodes import nodes_silent

    settings.TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS = 8
    settings.TRAINYARD_WORKER_STALE_SECONDS = 60
    run = two_machine_run(experiment_factory, user_factory)
    now = timezone.now()
    RunNode.objects.create(experiment=run, attempt=1, node_rank=0, worker="host-a",
                           started_at=now, heartbeat_at=now)  # fmt: skip
    for seconds, silent in ((30, False), (61, True)):
        # Node 0 keeps beating; host-b's worker may be reconnecting to the broker until its
        # machine would count as offline.
        later = now + timedelta(seconds=seconds)
        RunNode.objects.filter(experiment=run, node_rank=0).update(heartbeat_at=later)
        found = nodes_silent(now=later)
        assert ("host-b (node 1) never started" in found.get(run.pk, "")) is silent, found
