"""Status changes: only along the diagram's edges, and only from the status they start from."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from dashboard.experiments.core import transitions
from dashboard.experiments.core.signals import run_ended
from dashboard.experiments.core.transitions import NEXT, Outcome
from dashboard.experiments.models import Experiment, Status

pytestmark = pytest.mark.django_db


def test_every_status_is_in_the_diagram() -> None:
    assert set(NEXT) == set(Status)
    # And every one is reached from another (queued again from lost): none is left dangling.
    assert set().union(*NEXT.values()) == set(Status)


def test_a_start_counts_the_attempt_once(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory(), straggler_rank=1, straggler_text="rank 1 ...")
    now = timezone.now()
    assert transitions.experiment_start(experiment=run, worker="w1", now=now)
    # Another worker with the same message: the run is running already.
    assert not transitions.experiment_start(experiment=run, worker="w2", now=now)
    run.refresh_from_db()
    assert (run.status, run.worker, run.attempt, run.started_at) == ("running", "w1", 1, now)
    # The attempt's ranks are judged afresh (an earlier attempt's straggler is not kept).
    assert (run.straggler_rank, run.straggler_text) == (None, "")


def test_an_earlier_attempt_cannot_finish_a_later_one(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    Experiment.objects.filter(pk=run.pk).update(attempt=2)  # the reaper requeued, 2 started
    done = transitions.experiment_finish(
        experiment=run, outcome=Outcome(Status.SUCCEEDED), history=[], finished_at=timezone.now()
    )
    run.refresh_from_db()
    assert not done and run.status == Status.RUNNING and run.finished_at is None


def test_no_transition_off_the_diagram(user_factory: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING, attempt=1)
    with pytest.raises(ValueError, match="does not finish as lost"):
        transitions.experiment_finish(
            experiment=run, outcome=Outcome(Status.LOST), history=[], finished_at=timezone.now()
        )
    # A cancelled queued run is not queued any more: a late start changes nothing.
    queued = experiment_factory(owner=run.owner)
    now = timezone.now()
    assert transitions.experiment_cancel_queued(
        experiment_id=queued.pk, by=run.owner, error="stopped", now=now
    )
    assert not transitions.experiment_start(experiment=queued, worker="w1", now=now)
    queued.refresh_from_db()
    assert queued.status == Status.CANCELLED and queued.attempt == 0


def test_the_ends_of_a_run_are_the_statuses_nothing_follows() -> None:
    # Each of these is announced once to the owner (notifications); lost resumes or fails.
    assert {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED} == transitions.ENDS


def test_run_ended_is_sent_once_per_end_and_a_failing_receiver_changes_nothing(
    user_factory: Any, experiment_factory: Any
) -> None:
    heard: list[int] = []

    def listen(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
        heard.append(experiment_id)

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a receiver's bug")

    run = experiment_factory(owner=user_factory())
    now = timezone.now()
    run_ended.connect(listen, dispatch_uid="test-listen")
    run_ended.connect(broken, dispatch_uid="test-broken")
    try:
        assert transitions.experiment_start(experiment=run, worker="w1", now=now)
        run.refresh_from_db()
        history: list[dict[str, Any]] = []
        assert transitions.experiment_lose(experiment=run, reason="silent", history=history)
        assert heard == []  # lost is not an end: it resumes or fails
        assert transitions.experiment_give_up(experiment_id=run.pk, error="used up", now=now)
        assert not transitions.experiment_give_up(experiment_id=run.pk, error="twice", now=now)
    finally:
        run_ended.disconnect(dispatch_uid="test-listen")
        run_ended.disconnect(dispatch_uid="test-broken")
    run.refresh_from_db()
    assert heard == [run.pk] and run.status == Status.FAILED
