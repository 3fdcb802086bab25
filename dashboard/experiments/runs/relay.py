"""The relay of the training's output: fed its lines, it says what the sink gets.

Pure: no database, no process, no channel. The supervisor feeds it each line of stdout (events
of `training/protocol.py`, or plain output) and stderr, and stores and sends what it returns;
the attempt's state (state.py) is where it notes what the other parts read (the `started` and
final events, the ranks' PIDs).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from dashboard.experiments.core.log_noise import NOISE_LEVEL, noise_text
from dashboard.experiments.core.messages import Body, LogBody
from dashboard.experiments.runs.nodes import rank_pids_here
from dashboard.experiments.runs.sink import output_body
from dashboard.experiments.runs.state import AttemptState
from training.protocol import (
    CheckpointEvent,
    EpochEvent,
    Event,
    FailedEvent,
    FinishedEvent,
    LogEvent,
    ProtocolVersionError,
    StartedEvent,
    StepEvent,
    log_line_read,
    parse_event,
    rank_output_read,
)

STDERR_TAIL_LINES = 30


@dataclass
class Relayed:
    """What one line came to: the sink's entries, in order, and what the supervisor acts on."""

    entries: list[Event | Body] = field(default_factory=list)
    started: bool = False  # a `started` event: store the ranks' machines, reset the clock
    checkpoint_answered: bool = False  # a checkpoint event answered the pending request


class EventRelay:
    def __init__(self, *, state: AttemptState, machine: str = "", multinode: bool = False):
        self.state = state
        self.machine = machine  # on several machines, this one's name (log lines name it)
        self.multinode = multinode
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.echoes = StderrEchoes()

    def line_relay(self, source: str, line: str, *, now: float | None = None) -> Relayed:
        """One line of `source` ("stdout" or "stderr")."""
        relayed = Relayed()
        if source == "stderr":
            self.stderr_tail.append(line.rstrip())
            self.echoes.line_hold(line, now=time.monotonic() if now is None else now)
            return relayed
        try:
            event = parse_event(line)
        except ProtocolVersionError as exc:
            relayed.entries.append(output_body(f"{exc}: {line}", level="error"))
            return relayed
        if event is None:
            if line.strip() and self.state.stopped_by is None:
                relayed.entries.append(output_body(line, level=source))
            return relayed
        relay = self.EVENT_RELAYS.get(event["type"])
        entry = relay(self, event, relayed) if relay is not None else event
        relayed.entries.append(entry)
        return relayed

    def stderr_relay(self, now: float) -> list[Body]:
        """The stderr lines due now (held ones wait for an echo: StderrEchoes)."""
        return self.stderr_bodies(self.echoes.lines_due(now))

    def stderr_bodies(self, lines: list[str]) -> list[Body]:
        # After a Stop, the launcher's signal tracebacks are expected noise, not news; while a
        # script's ranks agree on a Stop and save (stop_deadline), their lines are still news.
        if self.state.stopped_by is not None and self.state.stop_deadline is None:
            return []
        bodies: list[Body] = []
        for line in filter(str.strip, lines):
            read = stderr_line_read(line)
            bodies.append(
                output_body(read.message, level=read.level, rank=read.rank, machine=self.machine)
            )
        return bodies

    def _started(self, event: StartedEvent, relayed: Relayed) -> StartedEvent:
        self.state.started_event = event
        machines = event.get("machines")
        self.state.rank_pids = rank_pids_here(
            pids=event.get("pids"),
            machines=machines,
            machine=self.machine if self.multinode else None,
        )
        if self.multinode and isinstance(machines, list):
            self.state.rank_machines = [str(m) for m in machines]
        relayed.started = True
        return event

    def _log(self, event: LogEvent, relayed: Relayed) -> LogEvent:
        self.echoes.event_heard(str(event.get("message", "")))
        # Rank 0 alone writes events: its log messages are kept as rank 0's (their stderr copy
        # is dropped as an echo), so that filtering the log by rank 0 finds them.
        tagged = {**event, "rank": 0, **({"machine": self.machine} if self.machine else {})}
        return cast(LogEvent, tagged)

    def _figures(self, event: StepEvent | EpochEvent, relayed: Relayed) -> StepEvent | EpochEvent:
        """Each rank's figures tagged with the machine it ran on (several machines only)."""
        ranks, machines = event.get("ranks"), self.state.rank_machines
        if not machines or not isinstance(ranks, list):
            return event
        tagged = [
            {**row, "machine": machines[row["rank"]]}
            if isinstance(row, dict) and row.get("rank") in range(len(machines))
            else row
            for row in ranks
        ]
        return cast(StepEvent | EpochEvent, {**event, "ranks": tagged})

    def _checkpoint(self, event: CheckpointEvent, relayed: Relayed) -> CheckpointEvent:
        relayed.checkpoint_answered = event.get("answers_request") is True
        return event

    def _final(self, event: FinishedEvent | FailedEvent, relayed: Relayed) -> LogBody:
        if self.state.training_finished():
            # A `failed` after `finished` (a SIGTERM or an error in the teardown): the results
            # are in and stand; say what happened without undoing them.
            return {"type": "log", "level": "warning",
                    "message": f"after the training finished: {final_message(event)}"}  # fmt: skip
        self.state.final_event = dict(event)
        stopped_by = self.state.stopped_by
        # Ended by the Stop it was asked for: no failure to report, nor its traceback.
        failed = event["type"] == "failed" and stopped_by is None
        if event["type"] == "failed" and failed and event.get("traceback"):
            relayed.entries.append(output_body(str(event["traceback"]), level="error"))
        # The final status is the dashboard's to say, once the process has exited.
        message = (
            final_message(event)
            if event["type"] == "finished" or stopped_by is None
            else f"training stopped, as {stopped_by} asked"
        )
        return {"type": "log", "level": "error" if failed else "info", "message": message}

    # What the relay makes of each type of event (a type not here goes to the sink as it came).
    EVENT_RELAYS: dict[str, Callable[[EventRelay, Any, Relayed], Event | LogBody]] = {
        "started": _started,
        "step": _figures,
        "epoch": _figures,
        "log": _log,
        "checkpoint": _checkpoint,
        "finished": _final,
        "failed": _final,
    }


@dataclass(frozen=True)
class StderrLine:
    """A line of the training's stderr as the log keeps it."""

    message: str
    rank: int | None  # the rank that wrote it; None for torchrun's own lines
    level: str


def stderr_line_read(line: str) -> StderrLine:
    """Whose a line of stderr was (torchrun's prefix, else what a marked log line says), and
    how the log keeps it: a training log line as its message and level (the run page filters
    by both), a library's known noise marked so (core/log_noise.py), any other line as it
    came, at level stderr."""
    output = rank_output_read(line.rstrip("\n"))
    read = log_line_read(output.line)
    if read is not None:
        rank = read.rank if read.rank is not None else output.rank
        return StderrLine(message=read.message, rank=rank, level=read.level or "stderr")
    noise = noise_text(output.line)
    if noise is not None:
        return StderrLine(message=noise, rank=output.rank, level=NOISE_LEVEL)
    return StderrLine(message=output.line, rank=output.rank, level="stderr")


class StderrEchoes:
    """Rank 0 writes each of its log messages twice: to stderr for a person at a shell, and as a
    ``log`` event. The run's log keeps the event; the stderr copy is dropped.

    The two come through separate pipes in either order, so one of the training's log lines
    (marked as ``training/protocol.py`` documents) is held for up to ``HOLD_SECONDS``: dropped if
    the event with its message comes, else shown after all (a message only stderr has, or
    another rank's). Lines behind a held one wait with it, so that stderr keeps its order.

    Only rank 0's lines can be echoes: every rank logs the same warnings (each loads the data),
    and rank 1's copy of a message rank 0 sent as an event is rank 1's own line, kept."""

    HOLD_SECONDS = 1.0

    def __init__(self) -> None:
        # (since, the message an event would carry if the line may be its echo, line)
        self.held: deque[tuple[float, str | None, str]] = deque()
        self.events: deque[str] = deque(maxlen=200)  # recent log events' messages

    def line_hold(self, line: str, *, now: float) -> None:
        read = log_line_read(rank_output_read(line).line)
        if read is None:
            self.held.append((now, None, line))
            return
        echo = read.message if read.rank in (0, None) else None
        if echo is not None and echo in self.events:
            return  # the echo of an event already stored
        self.held.append((now, echo, line))

    def event_heard(self, message: str) -> None:
        message = message.strip()
        self.events.append(message)
        self.held = deque(h for h in self.held if h[1] is None or h[1] != message)

    def lines_due(self, now: float) -> list[str]:
        """The lines to show now, in stderr's order: from the front, those not waiting for an
        echo, or waiting longer than ``HOLD_SECONDS``."""
        shown = []
        while self.held and (self.held[0][1] is None or now - self.held[0][0] >= self.HOLD_SECONDS):
            shown.append(self.held.popleft()[2])
        return shown


def final_message(event: FinishedEvent | FailedEvent) -> str:
    if event["type"] == "finished":
        accuracy = event.get("test_accuracy")
        shown = f"{accuracy:.2%}" if isinstance(accuracy, float) else "n/a"
        return f"training finished: test accuracy {shown}, test loss {event.get('test_loss')}"
    return f"training failed: {event.get('error')}"
