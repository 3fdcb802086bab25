"""The relay of the training's output, fed lines as the supervisor would: no subprocess, no
database. What it returns is what the sink would store and send."""

from __future__ import annotations

import json
from typing import Any

from dashboard.experiments.models import Status
from dashboard.experiments.runs.outcome import attempt_outcome
from dashboard.experiments.runs.relay import EventRelay
from dashboard.experiments.runs.state import AttemptState


def event_line(type_: str, **fields: Any) -> str:
    return json.dumps({"v": 1, "run": "", "seq": 1, "type": type_, "time": 1.0, **fields})


def test_a_started_event_names_the_ranks_to_signal_on_one_machine() -> None:
    relay = EventRelay(state=AttemptState())
    relayed = relay.line_relay("stdout", event_line("started", pids=[11, True, 22]))
    assert relayed.started and relay.state.started_event is not None
    assert relay.state.rank_pids == [11, 22]  # a bool is no PID
    assert [entry["type"] for entry in relayed.entries] == ["started"]


def test_on_several_machines_each_ranks_figures_name_its_machine() -> None:
    relay = EventRelay(state=AttemptState(), machine="host-b", multinode=True)
    relay.line_relay("stdout", event_line("started", pids=[1, 2], machines=["host-a", "host-b"]))
    assert relay.state.rank_pids == [2] and relay.state.rank_machines == ["host-a", "host-b"]
    [step] = relay.line_relay(
        "stdout", event_line("step", step=3, ranks=[{"rank": 0}, {"rank": 1}, {"rank": 7}])
    ).entries
    assert [row.get("machine") for row in step["ranks"]] == ["host-a", "host-b", None]


def test_a_failure_after_a_stop_is_the_stop_without_its_traceback() -> None:
    relay = EventRelay(state=AttemptState(stopped_by="alice"))
    relayed = relay.line_relay("stdout", event_line("failed", error="SIGTERM", traceback="Tb"))
    assert relayed.entries == [
        {"type": "log", "level": "info", "message": "training stopped, as alice asked"}
    ]
    outcome = attempt_outcome(state=relay.state, returncode=-15, stderr_tail=[])
    assert (outcome.status, outcome.error) == (Status.CANCELLED, "Stopped by alice.")


def test_a_failure_keeps_its_traceback_before_the_message() -> None:
    relay = EventRelay(state=AttemptState())
    relayed = relay.line_relay("stdout", event_line("failed", error="OOM", traceback="Tb"))
    assert [(e["level"], e["message"]) for e in relayed.entries] == [  # type: ignore[typeddict-item]
        ("error", "Tb"),
        ("error", "training failed: OOM"),
    ]
    outcome = attempt_outcome(state=relay.state, returncode=1, stderr_tail=[])
    assert (outcome.status, outcome.error) == (Status.FAILED, "OOM")


def test_plain_output_is_a_log_line_until_a_stop() -> None:
    state = AttemptState()
    relay = EventRelay(state=state)
    assert relay.line_relay("stdout", "hello\n").entries == [
        {"type": "log", "level": "stdout", "message": "hello"}
    ]
    state.stopped_by = "bob"
    assert relay.line_relay("stdout", "bye\n").entries == []
    relay.line_relay("stderr", "Traceback (most recent call last):\n")
    assert relay.stderr_relay(float("inf")) == []  # after a Stop: the signal's noise
    assert list(relay.stderr_tail) == ["Traceback (most recent call last):"]


def test_a_checkpoint_that_answers_a_request_says_so() -> None:
    relay = EventRelay(state=AttemptState())
    fields = {"epoch": 1, "step": 5, "path": "/x"}
    assert relay.line_relay(
        "stdout", event_line("checkpoint", answers_request=True, **fields)
    ).checkpoint_answered
    assert not relay.line_relay("stdout", event_line("checkpoint", **fields)).checkpoint_answered


def test_a_launcher_killed_from_outside_fails_with_its_stderr_tail() -> None:
    relay = EventRelay(state=AttemptState())
    relay.line_relay("stderr", "last words\n")
    outcome = attempt_outcome(state=relay.state, returncode=-9, stderr_tail=relay.stderr_tail)
    assert outcome.status == Status.FAILED
    assert outcome.error.startswith("training was ended by SIGKILL from outside the dashboard")
    assert outcome.error.endswith("\nlast words")


def test_an_epochs_memory_is_stored_as_counts_only() -> None:
    """Protocol 1.7's per-rank memory, as the sink keeps it for the read JSON: a malformed
    entry (a missing figure, a string, a negative count) is left out, not stored."""
    from dashboard.experiments.runs.sink import memory_entries

    good = {"rank": 0, "parameter_bytes": 10, "gradient_bytes": 10, "optimizer_state_bytes": 20,
            "peak_bytes": 99}  # fmt: skip
    assert memory_entries([good, {**good, "rank": 1}]) == [good, {**good, "rank": 1}]
    assert memory_entries([{**good, "peak_bytes": "x"}, {**good, "rank": -1}, {"rank": 2}]) == []
    assert memory_entries({"rank": 0}) == []
    assert memory_entries([{**good, "extra": "<script>"}]) == [good]
