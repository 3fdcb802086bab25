"""Stop, as the supervisor carries it out, against a real process tree.

The whole path (API → worker → every rank gone) is in tests/test_integration.py; here, the
moments a Stop can arrive in and what each must leave on the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import Client, TestCase
from django.utils import timezone

from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, LogLine, Status
from dashboard.experiments.runs.broadcast import experiment_group
from dashboard.experiments.runs.lifecycle import run_finish
from dashboard.experiments.runs.process import TrainingProcess
from dashboard.experiments.runs.runner import RunSupervisor
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.survival import experiment_mark_lost
from dashboard.experiments.services import experiment_stop
from training.protocol import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def tearing_down() -> Iterator[subprocess.Popen[str]]:
    """A launcher still tearing down (torchrun takes seconds after the last event)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True, text=True
    )
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def event_line(seq: int, type_: str, **fields: Any) -> str:
    return json.dumps({"v": 1, "run": "", "seq": seq, "type": type_, "time": 1.0, **fields})


def supervisor_of(run: Experiment) -> RunSupervisor:
    return RunSupervisor(experiment=run, sink=EventSink(run))


def test_a_stop_after_the_training_finished_keeps_its_results(
    user_factory: Any, experiment_factory: Any, tearing_down: subprocess.Popen[str]
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status=Status.RUNNING, attempt=1)
    supervisor = supervisor_of(run)
    supervisor.line_take("stdout", event_line(1, "finished", test_loss=0.21, test_accuracy=0.93))
    assert experiment_stop(experiment=run, by=alice)

    supervisor.requests_for(TrainingProcess(tearing_down)).requests_check()
    outcome = supervisor.outcome(tearing_down.wait(timeout=10))
    run_finish(experiment=run, sink=supervisor.sink, outcome=outcome)

    run.refresh_from_db()
    assert (run.status, run.test_accuracy, run.test_loss) == (Status.SUCCEEDED, 0.93, 0.21)
    assert run.cancelled_by is None and run.cancel_requested_at is None and run.error == ""
    messages = list(LogLine.objects.filter(experiment=run).values_list("message", flat=True))
    assert any("after the training had finished; its results stand" in m for m in messages)


def test_a_rank_aborting_in_its_teardown_after_finished_keeps_the_results(
    user_factory: Any, experiment_factory: Any
) -> None:
    """torchrun exits 1 when a rank aborts as Gloo tears down (seen with FSDP x2 on 2 busy
    cores): the training had finished, evaluated and checkpointed, so the run succeeded."""
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    supervisor = supervisor_of(run)
    supervisor.line_take("stdout", event_line(1, "finished", test_loss=0.3, test_accuracy=0.9))
    supervisor.relay.stderr_tail.append("terminate called without an active exception")
    outcome = supervisor.outcome(1)
    run_finish(experiment=run, sink=supervisor.sink, outcome=outcome)

    run.refresh_from_db()
    assert (run.status, run.test_accuracy, run.error) == (Status.SUCCEEDED, 0.9, "")
    logs = list(LogLine.objects.filter(experiment=run).values_list("level", "message"))
    assert ("warning", "a training process exited with code 1 after the training had finished "
            "(in its teardown); the results stand") in logs  # fmt: skip
    # Without `finished`, the same exit is a failure, with the process' last words.
    failing = experiment_factory(owner=run.owner, status=Status.RUNNING, attempt=1)
    supervisor = supervisor_of(failing)
    supervisor.relay.stderr_tail.append("terminate called without an active exception")
    outcome = supervisor.outcome(1)
    assert outcome.status == Status.FAILED and "without an active exception" in outcome.error


def test_processes_that_outlive_finished_by_the_bound_are_ended_and_the_run_succeeds(
    user_factory: Any, experiment_factory: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teardown that hangs after `finished` (a process group's destroy across machines, or
    NCCL's) is ended after TRAINYARD_TEARDOWN_SECONDS; the run keeps its results."""
    settings.TRAINYARD_TEARDOWN_SECONDS = 1
    finished = event_line(1, "finished", test_loss=0.25, test_accuracy=0.95)
    failed = event_line(2, "failed", error="stopped by SIGTERM")
    # As the engine does (training/cli.py) when a SIGTERM lands in Python code: a `failed`
    # event, exit 143. It must not take the finished run's results back.
    hangs = (f"import signal, sys, time; print({finished!r}, flush=True)\n"
             f"def bye(*_): print({failed!r}, flush=True); sys.exit(143)\n"
             "signal.signal(signal.SIGTERM, bye); time.sleep(60)")  # fmt: skip
    monkeypatch.setattr("dashboard.experiments.runs.runner.training_command",
                        lambda **_: [sys.executable, "-c", hangs])  # fmt: skip
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    supervisor = supervisor_of(run)
    started = time.monotonic()
    outcome = supervisor.run()
    assert time.monotonic() - started < 10  # 1 s, then SIGTERM (the sleep ends at once)
    assert outcome is not None and outcome.status == Status.SUCCEEDED
    assert (outcome.test_accuracy, outcome.error) == (0.95, "")
    run_finish(experiment=run, sink=supervisor.sink, outcome=outcome)
    assert Experiment.objects.get(pk=run.pk).status == Status.SUCCEEDED
    logs = list(LogLine.objects.filter(experiment=run).values_list("level", "message"))
    assert ("warning", "the training processes had not exited 1 s after the training finished, "
            "and were ended; the results stand") in logs  # fmt: skip
    assert ("warning", "after the training finished: training failed: stopped by SIGTERM") in logs


def test_a_stop_during_training_cancels(
    user_factory: Any, experiment_factory: Any, tearing_down: subprocess.Popen[str]
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status=Status.RUNNING, attempt=1)
    supervisor = supervisor_of(run)
    supervisor.line_take("stdout", event_line(1, "epoch", epoch=1, step=10, test_accuracy=0.5))
    assert experiment_stop(experiment=run, by=alice)

    supervisor.requests_for(TrainingProcess(tearing_down)).requests_check()
    # What the training says as the SIGTERM of the Stop ends it.
    traceback = "Traceback (most recent call last): ..."
    supervisor.line_take("stdout", event_line(2, "failed", error="by SIGTERM", traceback=traceback))
    outcome = supervisor.outcome(tearing_down.wait(timeout=10))
    run_finish(experiment=run, sink=supervisor.sink, outcome=outcome)

    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.error == f"Stopped by {alice.username}."
    logs = list(LogLine.objects.filter(experiment=run).values_list("level", "message"))
    assert ("info", f"training stopped, as {alice.username} asked") in logs
    assert not [m for level, m in logs if level == "error" or "Traceback" in m], logs
    assert run.cancelled_by == alice and run.test_accuracy == 0.5
    assert tearing_down.poll() is not None


def test_a_stopped_or_lost_run_keeps_the_figures_of_its_last_evaluation(
    user_factory: Any, experiment_factory: Any, tearing_down: subprocess.Popen[str]
) -> None:
    """Issue 34 item 1: the read JSON and the list of a run stopped (or lost) after its
    evaluations keep the last one's test accuracy and loss, as its charts keep the points."""
    alice = user_factory()
    client = Client()
    client.force_login(alice)
    stopped = experiment_factory(owner=alice, status=Status.RUNNING, attempt=1)
    supervisor = supervisor_of(stopped)
    for seq, (epoch, accuracy, loss) in enumerate([(1, 0.93, 0.2), (2, 0.964, 0.12)], start=1):
        supervisor.line_take("stdout", event_line(
            seq, "epoch", epoch=epoch, step=64 * epoch, test_accuracy=accuracy, test_loss=loss,
        ))  # fmt: skip
    supervisor.line_take("stdout", event_line(3, "epoch", epoch=3, step=192))  # not evaluated
    supervisor.sink.flush()
    assert experiment_stop(experiment=stopped, by=alice)
    supervisor.requests_for(TrainingProcess(tearing_down)).requests_check()
    outcome = supervisor.outcome(tearing_down.wait(timeout=10))
    assert run_finish(experiment=stopped, sink=supervisor.sink, outcome=outcome)

    lost = experiment_factory(owner=alice, status=Status.RUNNING, attempt=1,
                              heartbeat_at=timezone.now() - timedelta(minutes=5))  # fmt: skip
    sink = EventSink(lost)
    sink.add(cast(Event, {"type": "epoch", "epoch": 1, "step": 10, "test_accuracy": 0.9,
                          "test_loss": 0.3}))  # fmt: skip
    sink.flush()
    assert experiment_mark_lost(experiment=lost, now=timezone.now()) is not None

    read = client.get(f"/api/experiments/{stopped.pk}/").json()
    assert (read["status"], read["test_accuracy"], read["test_loss"]) == ("cancelled", 0.964, 0.12)
    read = client.get(f"/api/experiments/{lost.pk}/").json()
    assert (read["test_accuracy"], read["test_loss"]) == (0.9, 0.3)
    listed = {row["id"]: row for row in client.get("/api/experiments/").json()["experiments"]}
    assert listed[stopped.pk]["test_accuracy"] == 0.964


def _group_messages(run: Experiment, settle: Any) -> list[dict[str, Any]]:
    """What the run's page would receive while `settle` runs (the in-memory channel layer)."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(experiment_group(run.pk), channel)
    # The test's transaction never commits: run what a commit would (the sink's sends).
    with TestCase.captureOnCommitCallbacks(execute=True):
        settle()

    async def drain() -> list[dict[str, Any]]:
        got = []
        with contextlib.suppress(TimeoutError):
            while True:
                got.append(await asyncio.wait_for(layer.receive(channel), 0.3))
        return got

    return async_to_sync(drain)()


@pytest.mark.parametrize(("status", "settles"), [(Status.RUNNING, True), (Status.LOST, False)])
def test_an_attempt_the_reaper_gave_up_settles_nothing_and_tells_the_page_nothing(
    user_factory: Any, experiment_factory: Any, status: str, settles: bool
) -> None:
    run = experiment_factory(owner=user_factory(), status=status, attempt=1)
    outcome = Outcome(Status.SUCCEEDED, test_accuracy=0.9)
    result: list[bool] = []
    messages = _group_messages(
        run,
        lambda: result.append(run_finish(experiment=run, sink=EventSink(run), outcome=outcome)),
    )
    run.refresh_from_db()
    ends = [e for m in messages for e in m.get("events", [m]) if e.get("type") == "finished"]
    if settles:
        assert result == [True] and run.status == Status.SUCCEEDED and len(ends) == 1
    else:
        assert result == [False] and (run.status, run.test_accuracy) == (Status.LOST, None)
        assert ends == []
