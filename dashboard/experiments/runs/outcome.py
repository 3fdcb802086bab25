"""How an attempt ended, from what its training said and how its launcher exited."""

from __future__ import annotations

import signal
from collections.abc import Iterable

from django.conf import settings

from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Status
from dashboard.experiments.runs.state import AttemptState


def attempt_outcome(*, state: AttemptState, returncode: int, stderr_tail: Iterable[str]) -> Outcome:
    """The attempt's end. Only a ``finished`` training stands against a Stop and resume (its
    results are whole; the request is cleared). A training that emitted ``failed`` while a
    Stop and resume was pending is restarted all the same: a stall often ends in a collective
    timeout's failure (120 s) before or while its processes are ended, and the user asked for
    the run to go on from its last checkpoint. A plain Stop's attempt is cancelled either way."""
    final = state.final_event or {}
    # A finished event comes after the last evaluation and checkpoint: a Stop after it, or a
    # rank aborting in the process group's teardown (Gloo's "terminate called without an
    # active exception", now and then), only cut the teardown short and must not throw the
    # results away (teardown_failure says so in the log).
    if final.get("type") == "finished":
        return Outcome(
            Status.SUCCEEDED,
            test_loss=final.get("test_loss"),
            test_accuracy=final.get("test_accuracy"),
        )
    if state.stopped_by is not None and state.resuming:
        error = f"Stopped by {state.stopped_by} to resume from the last checkpoint."
        return Outcome(Status.CANCELLED, error=error, restart=True)
    if state.stopped_by is not None:
        return Outcome(Status.CANCELLED, error=f"Stopped by {state.stopped_by}.")
    if final.get("type") == "failed":
        return Outcome(Status.FAILED, error=str(final.get("error") or "training failed"))
    tail = "\n".join(stderr_tail)
    if returncode < 0 or returncode in {128 + signal.SIGTERM, 128 + signal.SIGKILL}:
        number = -returncode if returncode < 0 else returncode - 128
        reason = (
            f"training was ended by {signal.Signals(number).name} from outside the dashboard "
            "(a worker shutting down ends its runs)"
        )
        return Outcome(Status.FAILED, error=f"{reason}\n{tail}")
    return Outcome(Status.FAILED, error=f"training exited with code {returncode}\n{tail}")


def teardown_failure(*, state: AttemptState, returncode: int) -> str:
    """What to log when the training finished and yet its processes did not exit cleanly, on
    their own (a Stop's ending says so itself); "" when there is nothing to say."""
    final = state.final_event or {}
    if final.get("type") != "finished" or state.stopped_by is not None:
        return ""
    if state.teardown_ended:
        return (
            f"the training processes had not exited {settings.TRAINYARD_TEARDOWN_SECONDS:g} s "
            "after the training finished, and were ended; the results stand"
        )
    if returncode == 0:
        return ""
    return (
        f"a training process exited with code {returncode} after the training had finished "
        "(in its teardown); the results stand"
    )
