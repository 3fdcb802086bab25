"""Stop and resume from the last checkpoint (issue 33 item 3), the stalled banner's second button:
the route (POST /api/experiments/<id>/resume/: owner or staff, CSRF, the attempt the page showed
in the body; 409 where that attempt is over, the run is not running or not stalled, is stopping,
or has no checkpoint its next attempt can read), the banner's words for it (core/stalls.py: the
run pinned to the worker holding the file where no shared folder has it), the supervisor's side
(the attempt it ended queues the run again, core/transitions.py's restart, after a failure too),
and a run lost while it was asked (its requeue is the resume). The button in Chromium:
tests/test_stall_resume_browser.py.
The whole path with real processes: tests/test_engine_stall_stack.py."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.core import transitions
from dashboard.experiments.core.checkpoints import run_dir
from dashboard.experiments.core.stalls import RESUME_NODES, RESUME_NONE, RESUME_NOT_STALLED
from dashboard.experiments.models import Checkpoint, Experiment, Status
from dashboard.experiments.runs.lifecycle import run_finish, run_restart
from dashboard.experiments.runs.outcome import attempt_outcome
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.state import AttemptState
from dashboard.experiments.selectors import experiment_snapshot_build

pytestmark = pytest.mark.django_db

STALLED = {"since": "2026-12-06T10:02:02+00:00", "text": "No step for 62 s: rank 1 hangs.",
           "ranks": []}  # fmt: skip


@pytest.fixture(autouse=True)
def runs_dir(settings: Any, tmp_path: Path) -> Path:
    """The runs folder this web server sees (shared with the workers where they share one)."""
    settings.TRAINYARD_RUNS_DIR = tmp_path / "runs"
    return Path(settings.TRAINYARD_RUNS_DIR)


def stalled_run(
    experiment_factory: Any, owner: Any, *, saved: bool = True, on: str = "", **fields: Any
) -> Any:
    """A running run that stalled, with a checkpoint of step 32 where ``saved``: its file in
    the runs folder this server shares with the workers, or, ``on`` a worker, there only."""
    fields = {"status": Status.RUNNING, "attempt": 1, "stalled": STALLED, **fields}
    run = experiment_factory(owner=owner, **fields)
    if saved and on:
        Checkpoint.objects.create(
            experiment=run, epoch=1, step=32, path=f"/var/trainyard/runs/{run.pk}/e1.pt", worker=on
        )
    elif saved:
        path = run_dir(experiment_id=run.pk) / "checkpoints" / "epoch1.pt"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"weights")
        Checkpoint.objects.create(experiment=run, epoch=1, step=32, path=str(path))
    return run


def resume(client: Client, run: Any, **body: Any) -> Any:
    """The banner's request, for the attempt the page showed (the run's, unless said)."""
    body = {"attempt": run.attempt, **body}
    return client.post(
        f"/api/experiments/{run.pk}/resume/", json.dumps(body), content_type="application/json"
    )


def worker_online(name: str, *, ago: float = 0) -> WorkerMachine:
    at = timezone.now() - timedelta(seconds=ago)
    return WorkerMachine.objects.create(hostname=name, report={"cpu_count": 2}, reported_at=at)


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
    assert "has not started yet" in resume(client, queued, attempt=1).json()["error"]
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
    assert (
        'id="stalled-resume" data-attempt="1">Stop and resume from the last checkpoint</button>'
        in page
    )
    offer = "ends every process and starts attempt 2 from the last checkpoint (step 32)."
    assert f'id="stalled-resume-text">{offer}</span>' in page
    assert f"/api/experiments/{saved.pk}/resume/" in page
    snapshot = experiment_snapshot_build(experiment=saved, log_lines=10)
    assert snapshot["texts"]["stalled"]["resume"] == {"resumable": True, "text": offer}
    page = client.get(f"/experiments/{unsaved.pk}/").content.decode()
    assert 'id="stalled-resume" data-attempt="1" disabled>' in page and RESUME_NONE in page
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


def test_the_request_is_bound_to_the_attempt_and_the_stall_the_page_showed(
    user_factory: Any, experiment_factory: Any
) -> None:
    """A retry or a second tab after the restart never stops the next, healthy attempt: the
    body names the attempt (required), and only that attempt, stalled, is asked."""
    alice = user_factory(username="alice")
    client = logged_in(alice)
    run = stalled_run(experiment_factory, alice, worker="w1")
    for body in ({}, {"attempt": "1"}, {"attempt": True}, {"attempt": 1.5}):
        missing = client.post(f"/api/experiments/{run.pk}/resume/", json.dumps(body),
                              content_type="application/json")  # fmt: skip
        assert missing.status_code == 400 and "attempt" in missing.json()["error"], body
    assert client.post(f"/api/experiments/{run.pk}/resume/").status_code == 400  # no body
    assert resume(client, run).status_code == 202
    run.refresh_from_db()
    outcome = attempt_outcome(state=AttemptState(stopped_by="alice", resuming=True),
                              returncode=-15, stderr_tail=[])  # fmt: skip
    assert run_restart(experiment=run, sink=EventSink(run), outcome=outcome)
    assert "has not started yet" in resume(client, run, attempt=1).json()["error"]
    run.refresh_from_db()
    assert transitions.experiment_start(experiment=run, worker="w1", now=timezone.now())
    run.refresh_from_db()
    assert run.attempt == 2 and run.stalled is None
    stale = resume(client, run, attempt=1)  # the first page's retry, on attempt 2
    assert stale.status_code == 409
    assert stale.json()["error"] == (
        "the run has moved on: attempt 1 was asked to stop and resume, and attempt 2 runs now; "
        "reload the page to see it"
    )
    not_stalled = resume(client, run)  # attempt 2, stepping
    assert (not_stalled.status_code, not_stalled.json()["error"]) == (409, RESUME_NOT_STALLED)
    run.refresh_from_db()
    assert (run.cancel_requested_at, run.resume_requested) == (None, False)
    Experiment.objects.filter(pk=run.pk).update(stalled=STALLED)  # attempt 2 stalls too
    assert resume(client, run).status_code == 202


def test_a_run_lost_while_a_resume_was_pending_is_resumed_by_its_requeue(
    user_factory: Any, experiment_factory: Any
) -> None:
    """The requeue is the resume: attempt 2 starts unstopped, not to be killed and restarted as
    attempt 3. A plain Stop pending is left as it was."""
    alice = user_factory(username="alice")
    resuming, stopping = (
        stalled_run(experiment_factory, alice, worker="w1"),
        stalled_run(experiment_factory, alice, worker="w1"),
    )
    asked = timezone.now()
    Experiment.objects.filter(pk=resuming.pk).update(
        cancel_requested_at=asked, cancelled_by=alice, resume_requested=True
    )
    Experiment.objects.filter(pk=stopping.pk).update(cancel_requested_at=asked, cancelled_by=alice)
    for run in (resuming, stopping):
        run.refresh_from_db()
        assert transitions.experiment_lose(experiment=run, reason="silent", history=[])
        assert transitions.experiment_requeue(
            experiment_id=run.pk, waiting_reason="attempt 1 lost", now=timezone.now()
        )
    resumed, stopped = (Experiment.objects.get(pk=run.pk) for run in (resuming, stopping))
    assert resumed.status == Status.QUEUED
    assert (resumed.cancel_requested_at, resumed.cancelled_by, resumed.resume_requested) == (
        None, None, False,
    )  # fmt: skip
    assert (stopped.cancel_requested_at, stopped.cancelled_by) == (asked, alice)


def test_a_checkpoint_on_one_worker_pins_the_restart_there_or_is_refused(
    user_factory: Any, experiment_factory: Any
) -> None:
    """The next attempt resumes from the newest checkpoint whose file its worker reads; one
    that is not in the runs folder this server shares is on the worker that wrote it only: the
    offer says so and the run is pinned there (its `machines`, which the claim and the send
    follow), or it is refused where that worker is offline, unknown or not the run's."""
    alice = user_factory(username="alice")
    client = logged_in(alice)
    worker_online("w1")
    worker_online("w2", ago=3600)
    run = stalled_run(experiment_factory, alice, on="w1", worker="w1")
    offer = experiment_snapshot_build(experiment=run, log_lines=10)["texts"]["stalled"]["resume"]
    assert offer == {"resumable": True, "text": "ends every process and starts attempt 2 on w1, "
                     "where its file is, from the last checkpoint (step 32)."}  # fmt: skip
    assert resume(client, run).status_code == 202
    run.refresh_from_db()
    assert run.machines == ["w1"] and run.resume_requested is True
    offline = stalled_run(experiment_factory, alice, on="w2", worker="w2")
    refused = resume(client, offline)
    assert refused.status_code == 409
    assert refused.json()["error"] == (
        "The file of the last checkpoint (step 32) is on w2 only (not in a runs folder "
        "(TRAINYARD_RUNS_DIR) shared with the web server), and w2 is offline: a new attempt "
        "elsewhere would start from step 0. Stop ends the run."
    )
    page = client.get(f"/experiments/{offline.pk}/").content.decode()
    assert 'id="stalled-resume" data-attempt="1" disabled>' in page
    unknown = stalled_run(experiment_factory, alice, on="w1")
    Checkpoint.objects.filter(experiment=unknown).update(worker="")
    assert "no worker is known to hold it" in resume(client, unknown).json()["error"]
    elsewhere = stalled_run(experiment_factory, alice, on="w1", machines=["w3"])
    assert "the run is pinned to w3" in resume(client, elsewhere).json()["error"]
    for refused_run in (offline, unknown, elsewhere):
        refused_run.refresh_from_db()
        assert (refused_run.cancel_requested_at, refused_run.resume_requested) == (None, False)
    shared = stalled_run(experiment_factory, alice, worker="w2")  # the file is in the shared folder
    assert resume(client, shared).status_code == 202
    shared.refresh_from_db()
    assert shared.machines == []  # any worker reads it


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
