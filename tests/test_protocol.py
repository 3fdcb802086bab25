"""The event protocol's types, its version on the wire, its stderr marker and the page's messages:
each checked against what the real writers (a training run, the sink) write."""

from __future__ import annotations

import io
import json
import logging
import typing
from pathlib import Path
from typing import Any

import pytest

from training import protocol
from training.protocol import (
    EVENT_CLASSES,
    EVENT_TYPES,
    PROTOCOL_MINOR,
    PROTOCOL_VERSION,
    Envelope,
    EventWriter,
    ProtocolVersionError,
    RankReport,
    SharedTensor,
    Stage,
    log_line_format,
    log_line_message,
    parse_event,
)

# Fields that only some runs write (deepspeed, model-parallel; compile_seconds with --compile).
# Fields only some strategies write: deepspeed's, model parallel's, --compile's, a script run's.
# (arrived_late_seconds and collectives: a rank's arrival at collectives, 1.14, which one
# process, Hogwild's and a pipeline's stages do not say; checked where they are, by
# tests/test_script_observer.py and tests/test_stragglers.py.)
STRATEGY_FIELDS = {
    "zero_stage", "stages", "compile_seconds", "script", "stop_pid", "arrived_late_seconds",
    "collectives",
}  # fmt: skip
# Fields of a type that only a script's observer writes (protocol 1.12): a step's memory, which
# the engine says in its epoch events (checked there).
OBSERVER_FIELDS = {"StepEvent": {"memory"}}
# Fields only a language model's run writes (protocol 1.15; tests/test_lm_training.py checks
# them).
LANGUAGE_FIELDS = {
    "peak_flops", "peak_source", "tokens_per_second", "mfu", "grad_norm", "bits_per_byte",
    "perplexity", "sample",
}  # fmt: skip


def line(**fields: Any) -> str:
    return json.dumps({"v": 1, "run": "r", "seq": 1, "type": "log", "time": 0.5, **fields})


# ---- the version on the wire ------------------------------------------------------------------


def test_the_writer_puts_major_and_minor_on_the_wire() -> None:
    buffer = io.StringIO()
    EventWriter("r", stream=buffer).log("hello")
    event = json.loads(buffer.getvalue())
    assert (event["v"], event["minor"]) == (PROTOCOL_VERSION, PROTOCOL_MINOR) == (1, 15)
    # A reader of 1.0 to 1.2 checked only that v is an int it knows: it still reads this.
    assert isinstance(event["v"], int) and not isinstance(event["v"], bool)


@pytest.mark.parametrize(
    "fields",
    [{}, {"minor": 0}, {"minor": 2}, {"minor": 3}, {"minor": 17}],
    ids=["1.0-1.2 (no minor)", "1.0", "1.2", "1.3", "a later 1.x"],
)
def test_every_1x_is_read(fields: dict[str, Any]) -> None:
    event = parse_event(line(level="info", message="m", **fields))
    assert event is not None and event["type"] == "log"


def test_a_higher_major_stops_the_reader() -> None:
    with pytest.raises(ProtocolVersionError) as refused:
        parse_event(line(v=2, minor=0, level="info", message="m"))
    assert refused.value.version == 2
    assert str(refused.value) == "unknown protocol version 2"


@pytest.mark.parametrize(
    "text",
    [
        "plain output",
        "[1, 2]",
        "{not json",
        line(type="gossip"),
        line(v="1.3"),  # the major is an int; the minor has its own field
        line(v=True),
        line(minor="3"),
        line(seq=None),
    ],
)
def test_what_is_no_event_is_plain_output(text: str) -> None:
    assert parse_event(text) is None


# ---- the types against a real run's events --------------------------------------------------


def _keys(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    hints = typing.get_type_hints(cls)
    return cls.__required_keys__, frozenset(hints)  # type: ignore[attr-defined]


def assert_matches(entry: dict[str, Any], cls: type, *, every: bool) -> None:
    """``entry`` has every required key of ``cls`` and no key it does not declare; with
    ``every``, also each optional one (the current writer writes them all)."""
    required, declared = _keys(cls)
    assert required <= entry.keys(), (cls.__name__, required - entry.keys())
    assert entry.keys() <= declared, (cls.__name__, entry.keys() - declared)
    if every:
        optional = STRATEGY_FIELDS | LANGUAGE_FIELDS | OBSERVER_FIELDS.get(cls.__name__, set())
        assert declared - optional <= entry.keys(), (cls.__name__, declared - entry.keys())


def assert_nested_match(event: dict[str, Any], *, every: bool = True) -> None:
    for rank in event.get("ranks", []):
        assert_matches(rank, RankReport, every=every)
    for tensor in event.get("shared_tensors", []):
        assert_matches(tensor, SharedTensor, every=every)
    for stage in event.get("stages", []):
        assert_matches(stage, Stage, every=every)


def assert_typed(events: list[dict[str, Any]], *, every: bool) -> None:
    """A real run's events against their types (training/protocol.py), nested entries too.
    Every run the engine's tests make is checked (tests/test_training.py's assert_well_formed,
    without ``every``: a run of any strategy and options); single, Hogwild and model parallel,
    whose nested entries differ, with ``every`` in their main runs, which also see every type
    (tests/test_training.py, tests/test_training_strategies.py)."""
    for event in events:
        assert_matches(event, EVENT_CLASSES[event["type"]], every=every)
        assert_nested_match(event, every=every)


def test_a_real_failed_event_matches_its_type(sample_data: Path, tmp_path: Path) -> None:
    from tests.test_training import run_cli

    bogus = tmp_path / "bogus.pt"
    bogus.write_text("not a checkpoint")
    result = run_cli(sample_data, "--dry-run", "--resume", str(bogus))
    assert result.events[-1]["type"] == "failed"
    assert_matches(result.events[-1], EVENT_CLASSES["failed"], every=True)


def test_the_types_and_the_prose_are_in_step() -> None:
    assert set(EVENT_CLASSES) == EVENT_TYPES
    doc = protocol.__doc__ or ""
    # The history moved out of the docstring to the protocol's page, which the docstring names.
    assert "docs/protocol.md" in doc
    history = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
    for name in _keys(Envelope)[1] | {"type"}:
        assert f"\n    {name} " in doc, name
    for cls in EVENT_CLASSES.values():
        required, declared = _keys(cls)
        # Each field added after 1.0 is named in the history's "Added in 1.x" sections.
        for name in declared - required - {"minor"}:
            # "Added in 1.1" is also the start of "Added in 1.10": split at the whole heading.
            assert name in history.split("### Added in 1.1\n")[1], (cls.__name__, name)


# ---- the stderr marker ------------------------------------------------------------------------


def test_a_log_line_round_trips_through_its_marker() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(log_line_format(rank=3)))
    logger = logging.getLogger("test_protocol.marker")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("Data: 5,000 digits | split 4,000/1,000")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert written.startswith("[trainyard] ") and " rank 3 WARNING | " in written
    assert log_line_message(written) == "Data: 5,000 digits | split 4,000/1,000"


@pytest.mark.parametrize(
    "other",
    [
        "Traceback (most recent call last):\n",
        "W1203 03:00:00.000 torch/distributed/run.py:1] Setting OMP_NUM_THREADS\n",
        "[trainyard] a line without its separator\n",
        "2026-12-02 17:33:42,033 trainyard[rank 0] WARNING the format before 1.3\n",
    ],
)
def test_other_stderr_lines_carry_no_message(other: str) -> None:
    assert log_line_message(other) is None


def test_a_real_runs_log_events_are_marked_on_stderr(sample_data: Path) -> None:
    from tests.test_training import run_cli

    result = run_cli(sample_data, "--dry-run", "--run-id", "marked")
    assert result.returncode == 0, result.stderr[-3000:]
    on_stderr = {log_line_message(text) for text in result.stderr.splitlines(keepends=True)}
    messages = [e["message"] for e in result.events if e["type"] == "log"]
    assert messages and all(m in on_stderr for m in messages)


# ---- the page's messages against what the sink sends ---------------------------------------


@pytest.mark.django_db
def test_the_sinks_messages_match_their_types(
    user_factory: Any, experiment_factory: Any, tmp_path: Path
) -> None:
    from dashboard.experiments.core import messages
    from dashboard.experiments.runs.sink import EventSink

    run = experiment_factory(owner=user_factory(), status="running", attempt=1)
    sink = EventSink(run)
    path = tmp_path / "epoch-1.pt"
    path.write_bytes(b"x")
    event = {"v": 1, "minor": 3, "run": "r", "seq": 9, "time": 1.0}
    sent = [
        (sink.add({**event, "type": "checkpoint", "epoch": 1, "step": 3, "path": str(path),
                   "requested": False, "answers_request": False}),
         messages.CheckpointMessage),
        (sink.add({"type": "status", "status": "queued", "reason": "no GPU free"}),
         messages.StatusMessage),
        (sink.add({"type": "finished", "status": "succeeded", "test_loss": 0.1,
                   "test_accuracy": 0.9}),
         messages.RunFinishedMessage),
        (sink.add({"type": "failed", "status": "failed", "error": "boom"}),
         messages.RunFailedMessage),
    ]  # fmt: skip
    sink.add_output("a line of stderr\n", level="stderr")
    sent.append((sink.messages[-1], messages.LogMessage))
    for message, cls in sent:
        assert_matches(dict(message), cls, every=False)
    assert [m["seq"] for m, _ in sent] == [1, 2, 3, 4, 5]
    assert sent[0][0]["log_text"] == "checkpoint of epoch 1 saved"  # type: ignore[typeddict-item]
