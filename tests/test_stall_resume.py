"""Stop and resume from the last checkpoint (issue 33 item 3), the stalled banner's second button:
the route (POST /api/experiments/<id>/resume/: owner or staff, CSRF, 409 where the run is not
running, is stopping or has no checkpoint), the banner's words for it (core/stalls.py), and the
supervisor's side (the attempt it ended queues the run again, core/transitions.py's restart).
The whole path with real processes: tests/test_script_stack.py's engine test."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dashboard.experiments.core.stalls import RESUME_NODES, RESUME_NONE
from dashboard.experiments.models import Checkpoint, Experiment, Status
from dashboard.experiments.runs.lifecycle import run_finish, run_restart
from dashboard.experiments.runs.outcome import attempt_outcome
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.state import AttemptState
from dashboard.experiments.selectors import experiment_snapshot_build

pytestmark = pytest.mark.django_db

STALLED = {"since": "2026-12-06T10:02:02+00:00", "text": "No step for 62 s: rank 1 hangs.",
           "ranks": []}  # fmt: skip


def stalled_run(experiment_factory: Any, owner: Any, *, saved: bool = True, **fields: Any) -> Any:
    """A running run that stalled, with a checkpoint of step 32 where ``saved``."""
    fields = {"status": Status.RUNNING, "attempt": 1, "stalled": STALLED, **fields}
    run = experiment_factory(owner=owner, **fields)
    if saved:
        Checkpoint.objects.create(experiment=run, epoch=1, step=32, path="/runs/7/epoch1.pt")
    return run


def resume(client: Client, run: Any) -> Any:
    return client.post(f"/api/experiments/{run.pk}/resume/")


def logged_in(user: Any, **options: Any) -> Client:
    client = Client(**options)
    client.force_login(user)
    return client


def test_only_the_owner_or_staff_may_stop_and_resume_a_run_and_only_with_the_csrf_token(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = stalled_run(experiment_factory, alice)
    assert resume(logged_in(bob), run).status_code == 404  # not even shown to him
    refused = resume(logged_in(alice, enforce_csrf_checks=True), run)
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    assert resume(Client(), run).status_code == 401
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.resume_requested is False
    asked = resume(logged_in(staff), run)
    assert asked.status_code == 202, asked.content
    assert asked.json()["status"] == "running" and asked.json()["stop_requested"] is True
    run.refresh_from_db()
    assert run.resume_requested is True and run.cancelled_by == staff


def test_a_run_with_no_checkpoint_not_running_or_stopping_already_is_refused(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    client = logged_in(alice)
    unsaved = stalled_run(experiment_factory, alice, saved=False)
    refused = resume(client, unsaved)
    assert (refused.status_code, refused.json()["error"]) == (409, RESUME_NONE)
    nodes = stalled_run(experiment_factory, alice, nodes=2)
    assert resume(client, nodes).json()["error"] == RESUME_NODES
    queued = stalled_run(experiment_factory, alice, status=Status.QUEUED, attempt=0)
    assert "has not started yet" in resume(client, queued).json()["error"]
    ended = stalled_run(experiment_factory, alice, status=Status.SUCCEEDED)
    assert resume(client, ended).json()["error"] == (
        "the run is succeeded; only a running run can be stopped and resumed"
    )
    run = stalled_run(experiment_factory, alice)
    assert resume(client, run).status_code == 202
    again = resume(client, run)  # the conditional update changes no row the second time
    assert (again.status_code, again.json()["error"]) == (409, "the run is stopping")
    assert client.post(f"/api/experiments/{run.pk}/stop/").status_code == 202  # a Stop is one
    for refused_run in (unsaved, nodes, queued, ended):
        refused_run.refresh_from_db()
        assert refused_run.resume_requested is False


def test_the_banner_offers_it_where_a_checkpoint_is_and_says_why_not_where_none(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    client = logged_in(alice)
    saved, unsaved = (
        stalled_run(experiment_factory, alice),
        stalled_run(experiment_factory, alice, saved=False),
    )
    page = client.get(f"/experiments/{saved.pk}/").content.decode()
    assert 'id="stalled-resume">Stop and resume from the last checkpoint</button>' in page
    offer = "ends every process and starts attempt 2 from the last checkpoint (step 32)."
    assert f'id="stalled-resume-text">{offer}</span>' in page
    assert f"/api/experiments/{saved.pk}/resume/" in page
    snapshot = experiment_snapshot_build(experiment=saved, log_lines=10)
    assert snapshot["texts"]["stalled"]["resume"] == {"resumable": True, "text": offer}
    page = client.get(f"/experiments/{unsaved.pk}/").content.decode()
    assert 'id="stalled-resume" disabled>' in page and RESUME_NONE in page
    # Another user sees the run nowhere; a finished run's page has no buttons.
    unsaved.status = Status.FAILED
    unsaved.save()
    assert 'id="stalled-resume"' not in client.get(f"/experiments/{unsaved.pk}/").content.decode()


def test_the_attempt_a_stop_and_resume_ended_queues_the_run_again(
    user_factory: Any, experiment_factory: Any
) -> None:
    """The supervisor's part, after it ended every process as for a Stop (runs/requests.py):
    the outcome asks for a restart, the row goes back to queued with the attempt recorded and
    the stall and the Stop cleared; the next claim's attempt resumes (runs/attempts.py)."""
    alice = user_factory(username="alice")
    run = stalled_run(experiment_factory, alice, worker="w1")
    Experiment.objects.filter(pk=run.pk).update(resume_requested=True)
    state = AttemptState(stopped_by="alice", resuming=True)
    outcome = attempt_outcome(state=state, returncode=-15, stderr_tail=[])
    assert (outcome.status, outcome.restart) == (Status.CANCELLED, True)
    assert outcome.error == "Stopped by alice to resume from the last checkpoint."
    assert run_restart(experiment=run, sink=EventSink(run), outcome=outcome)
    row = Experiment.objects.get(pk=run.pk)
    assert (row.status, row.stalled, row.cancel_requested_at, row.resume_requested) == (
        Status.QUEUED, None, None, False,
    )  # fmt: skip
    assert row.waiting_reason == "attempt 1 stopped to resume from its last checkpoint"
    [ended] = row.attempts
    assert (ended["attempt"], ended["outcome"], ended["worker"]) == (1, "cancelled", "w1")
    assert ended["reason"] == outcome.error
    assert not run_restart(experiment=run, sink=EventSink(run), outcome=outcome)  # moved on
    # A plain Stop still cancels.
    assert attempt_outcome(state=AttemptState(stopped_by="alice"), returncode=-15,
                           stderr_tail=[]).restart is False  # fmt: skip


def test_a_stop_and_resume_after_the_training_finished_resumes_nothing(
    user_factory: Any, experiment_factory: Any
) -> None:
    """The training's `finished` came first: its results stand, the request is cleared."""
    alice = user_factory(username="alice")
    run = stalled_run(experiment_factory, alice)
    Experiment.objects.filter(pk=run.pk).update(resume_requested=True)
    state = AttemptState(stopped_by="alice", resuming=True, final_event={"type": "finished"})
    outcome = attempt_outcome(state=state, returncode=0, stderr_tail=[])
    assert (outcome.status, outcome.restart) == (Status.SUCCEEDED, False)
    assert run_finish(experiment=run, sink=EventSink(run), outcome=outcome)
    row = Experiment.objects.get(pk=run.pk)
    assert (row.status, row.resume_requested, row.stalled) == (Status.SUCCEEDED, False, None)


def test_a_training_that_failed_while_a_resume_was_pending_is_restarted(
    user_factory: Any, experiment_factory: Any
) -> None:
    """A stall often ends in a collective timeout's failure before its processes are ended;
    the user asked for the run to go on from its checkpoint: it is queued again, not failed
    (only a training that finished stands against the request)."""
    alice = user_factory(username="alice")
    run = stalled_run(experiment_factory, alice, worker="w1")
    Experiment.objects.filter(pk=run.pk).update(resume_requested=True)
    failed = {"type": "failed", "error": "gloo: Timed out waiting 120000ms for recv"}
    state = AttemptState(stopped_by="alice", resuming=True, final_event=failed)
    outcome = attempt_outcome(state=state, returncode=1, stderr_tail=[])
    assert (outcome.status, outcome.restart) == (Status.CANCELLED, True)
    assert run_restart(experiment=run, sink=EventSink(run), outcome=outcome)
    row = Experiment.objects.get(pk=run.pk)
    assert (row.status, row.resume_requested, row.cancel_requested_at) == (
        Status.QUEUED, False, None,
    )  # fmt: skip
    # Without the request the failure stands.
    plain = attempt_outcome(state=AttemptState(final_event=failed), returncode=1, stderr_tail=[])
    assert (plain.status, plain.restart) == (Status.FAILED, False)
