"""What a run's row asks of its running training: a Stop, a checkpoint now, a profile.

A person asks through services.py, which writes the request on the row (a profile: a
`requested` Profile row); the supervisor polls the row (one query for all) and carries it out
here: a Stop ends every process, a checkpoint request is passed to the process the training
named for requests (`requests_pid`, SIGUSR1), and so is a profile request (SIGUSR2, after
writing what to record into the training's `profile_dir`: runs/profiles.py).
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import OuterRef, Subquery

from dashboard.experiments.core.profiles import SCRIPT_UNPROFILED
from dashboard.experiments.models import Experiment, Profile, ProfileState
from dashboard.experiments.runs.bounds import is_count
from dashboard.experiments.runs.process import TrainingProcess
from dashboard.experiments.runs.profiles import profile_fail, profile_request_write
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.state import AttemptState
from dashboard.experiments.runs.stragglers import events_flush
from training.registry import strategy_get
from training.scripts.launch import KILL_GRACE_SECONDS

# A training's word on how long its ranks need to stop is bounded: a day.
MAX_STOP_GRACE_SECONDS = 86400.0
# After a script's Stop grace, its launcher's SIGTERM-then-SIGKILL of what is left
# (training/scripts/launch.py's KILL_GRACE_SECONDS) and a margin.
LAUNCHER_END_SECONDS = KILL_GRACE_SECONDS + 2.0


class RunRequests:
    def __init__(
        self, *, experiment: Experiment, sink: EventSink, state: AttemptState,
        process: TrainingProcess,
    ):  # fmt: skip
        self.experiment = experiment
        self.sink = sink
        self.state = state
        self.process = process

    def requests_check(self) -> None:
        """What the run's row asks of this run: a stop, a checkpoint, a profile (one query)."""
        asked = Profile.objects.filter(
            experiment_id=OuterRef("pk"), state=ProfileState.REQUESTED
        ).order_by("pk")
        row = (
            Experiment.objects.filter(pk=self.experiment.pk)
            .annotate(
                profile_id=Subquery(asked.values("pk")[:1]),
                profile_steps=Subquery(asked.values("steps")[:1]),
            )
            .values(
                "cancel_requested_at",
                "cancelled_by__username",
                "resume_requested",
                "checkpoint_requested_at",
                "checkpoint_requested_by__username",
                "profile_id",
                "profile_steps",
            )
            .first()
        )
        if row is None:
            return
        if row["cancel_requested_at"] is not None:
            self.state.resuming = row["resume_requested"]  # then queued again (outcome.py)
            self.stop(by=row["cancelled_by__username"] or "someone")
        elif row["checkpoint_requested_at"] not in (None, self.state.checkpoint_signalled):
            self.checkpoint_request_pass(
                requested_at=row["checkpoint_requested_at"],
                by=row["checkpoint_requested_by__username"] or "someone",
            )
        if row["cancel_requested_at"] is None and row["profile_id"] not in (
            None, self.state.profile_signalled,
        ):  # fmt: skip
            self.profile_request_pass(profile_id=row["profile_id"], steps=row["profile_steps"])

    def profile_request_pass(self, *, profile_id: int, steps: int) -> None:
        """Write the request where the training reads it and signal it; wait while it has not
        started. The row stays `requested` until the training's `recording` event."""
        started = self.state.started_event
        if started is None:
            return
        pid, folder = started.get("requests_pid"), started.get("profile_dir")
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(folder, str):
            self._profile_drop(
                profile_id, SCRIPT_UNPROFILED if strategy_get(self.experiment.strategy).user_script
                else "this training takes no profile requests (its started event names no "
                "profile_dir: an engine before protocol 1.10, or a strategy that cannot)",
            )  # fmt: skip
            return
        if failed := profile_request_write(profile_dir=folder, profile_id=profile_id, steps=steps):
            self._profile_drop(profile_id, failed)
        elif self.process.signal_in_tree(pid=pid, signum=signal.SIGUSR2):
            self.state.profile_signalled = profile_id
            self.sink.add_output(
                f"Profile of {steps} step(s) requested; every rank records from the training's "
                "next reported step.",
                level="info",
            )
        else:
            self._profile_drop(profile_id, "the training has ended")

    def _profile_drop(self, profile_id: int, reason: str) -> None:
        """The profile cannot be recorded: the row says why, and the page hears of it."""
        profile_fail(experiment_id=self.experiment.pk, profile_id=profile_id, message=reason)
        self.sink.add({"type": "profile", "profile": profile_id, "state": "refused", "steps": 0,
                       "message": reason})  # fmt: skip

    def checkpoint_request_pass(self, *, requested_at: datetime, by: str) -> None:
        """Signal the process the training named for requests; wait while it has not started.

        The request stays on the row, so that a page shows it pending, until the training's
        checkpoint event answers it (``checkpoint_request_answered``); asking again meanwhile
        is the same request."""
        started = self.state.started_event
        if started is None:
            return
        pid = started.get("requests_pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            self._checkpoint_request_drop(
                requested_at,
                f"Checkpoint requested by {by}, but this training does not take requests (its "
                "started event names no requests_pid); it writes one each epoch.",
            )
        elif self.process.signal_in_tree(pid=pid, signum=signal.SIGUSR1):
            self.state.checkpoint_signalled = requested_at
            self.sink.add_output(
                f"Checkpoint requested by {by}; the training writes it after its current step.",
                level="info",
            )
        else:
            self._checkpoint_request_drop(
                requested_at, f"Checkpoint requested by {by}, but the training has ended."
            )

    def checkpoint_request_answered(self) -> None:
        if self.state.checkpoint_signalled is None:
            return
        # Conditional: a request made after the signal was sent is a new one, for the next poll.
        Experiment.objects.filter(
            pk=self.experiment.pk, checkpoint_requested_at__lte=self.state.checkpoint_signalled
        ).update(checkpoint_requested_at=None, checkpoint_requested_by=None)
        self.state.checkpoint_signalled = None

    def _checkpoint_request_drop(self, requested_at: datetime, reason: str) -> None:
        Experiment.objects.filter(
            pk=self.experiment.pk, checkpoint_requested_at=requested_at
        ).update(checkpoint_requested_at=None, checkpoint_requested_by=None)
        self.sink.add_output(reason, level="warning")

    def stop(self, *, by: str) -> None:
        self.state.stopped_by = by
        if self.stop_agreed(by=by):
            return
        if self.state.training_finished():
            # The ranks are only tearing down (seconds for torchrun): ending them loses nothing.
            message = f"Stop requested by {by} after the training had finished; its results stand"
        elif self.state.resuming:
            message = (f"Stop and resume from the last checkpoint requested by {by}; ending "
                       "every process, then queuing the run's next attempt")  # fmt: skip
        else:
            message = f"Stop requested by {by}; ending every process"
        self.sink.add_output(message, level="info")
        try:
            events_flush(sink=self.sink)  # steps not flushed yet may name a straggler
        finally:
            # Signalled even where the database refused: a stop, once begun, is never asked again.
            killed = self.process.stop(
                rank_pids=self.state.rank_pids, grace_seconds=settings.TRAINYARD_STOP_GRACE_SECONDS
            )
        if killed:
            self.sink.add_output(f"killed after the grace period: {killed}", level="warning")

    def stop_agreed(self, *, by: str) -> bool:
        """A script run's Stop (protocol 1.11): SIGTERM to the process its `started` named, whose
        ranks agree on a step, save and leave within its grace period; what is left after it
        (and the launcher's own ending) is ended by `stop_overdue`. On a script run's other
        machines, whose launchers write no `started`, the launcher (this supervisor's child) is
        that process, so that no machine's ranks are killed while the others' agree. False
        where the training named no such process, or it has ended: the Stop ends every process
        at once."""
        started: dict[str, Any] = dict(self.state.started_event or {})
        pid, script = started.get("stop_pid"), started.get("script")
        grace = script.get("stop_grace") if isinstance(script, dict) else None
        if not started and strategy_get(self.experiment.strategy).user_script:
            pid, grace = self.process.pid, settings.TRAINYARD_SCRIPT_STOP_SECONDS
        if not isinstance(pid, int) or not is_count(pid) or pid == 0:
            return False
        if not isinstance(grace, (int, float)) or isinstance(grace, bool):
            return False
        if self.state.training_finished() or not self.process.signal_in_tree(
            pid=pid, signum=signal.SIGTERM
        ):
            return False
        # The launcher's own ending of what is left (its SIGTERM, then SIGKILL) comes first, so
        # that it names the ranks it ended; this machine's grace after that.
        wait = (min(float(grace), MAX_STOP_GRACE_SECONDS) + LAUNCHER_END_SECONDS
                + settings.TRAINYARD_STOP_GRACE_SECONDS)  # fmt: skip
        self.state.stop_deadline = time.monotonic() + wait
        self.sink.add_output(
            f"Stop requested by {by}; every rank stops at the same step, saves and leaves "
            f"(within {grace:g} s)",
            level="info",
        )
        return True

    def stop_overdue(self, now: float) -> None:
        """End what is left of an agreed Stop once its time is up (the loop asks each turn)."""
        if self.state.stop_deadline is None or now < self.state.stop_deadline:
            return
        self.state.stop_deadline = None
        killed = self.process.stop(rank_pids=self.state.rank_pids, grace_seconds=2)
        if killed:
            self.sink.add_output(f"killed after the Stop's grace period: {killed}",
                                 level="warning")  # fmt: skip
