"""Checkpoint now: the request (API, admin, page), and how the supervisor passes it on.

The training side (SIGUSR1, mid-epoch files, exact resume) is in tests/test_exactness.py; the
whole path through a real worker in tests/test_integration.py and tests/test_browser.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import psutil
import pytest
from django.test import Client

from dashboard.accounts.models import ApiToken
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.processes import process_in_tree_signal
from tests.factories import asked_then_ended, logged_in
from tests.stack import wait_for

pytestmark = pytest.mark.django_db


def ask(client: Client, run: Experiment, **headers: str) -> Any:
    return client.post(f"/api/experiments/{run.pk}/checkpoint/", **headers)


def test_owner_and_staff_ask_a_running_run(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=alice, status="running")
    assert ask(logged_in(bob), run).status_code == 404
    response = ask(logged_in(alice), run)
    assert response.status_code == 202 and response.json()["checkpoint_requested"] is True
    run.refresh_from_db()
    assert run.checkpoint_requested_at is not None and run.checkpoint_requested_by == alice
    # Asking again before it is passed on is the same request.
    assert ask(logged_in(staff), run).status_code == 202
    run.refresh_from_db()
    assert run.checkpoint_requested_by == staff


def test_a_token_may_ask(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status="running")
    token = ApiToken.objects.create(user=alice)
    client = Client(enforce_csrf_checks=True)
    response = ask(client, run, HTTP_AUTHORIZATION=f"Bearer {token.key}")
    assert response.status_code == 202, response.content


@pytest.mark.parametrize(
    ("status", "stopping", "says"),
    [
        ("queued", False, "has not started yet"),
        ("succeeded", False, "the run is succeeded"),
        ("failed", False, "only a running run"),
        ("running", True, "the run is stopping"),
    ],
)
def test_only_a_running_run_is_asked(
    user_factory: Any, experiment_factory: Any, status: str, stopping: bool, says: str
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status=status)
    if stopping:
        Experiment.objects.filter(pk=run.pk).update(cancel_requested_at=run.created_at)
    response = ask(logged_in(alice), run)
    assert response.status_code == 409 and says in response.json()["error"]
    run.refresh_from_db()
    assert run.checkpoint_requested_at is None


def test_admin_action_asks_running_runs_and_says_why_not_others(
    user_factory: Any, experiment_factory: Any
) -> None:
    boss = user_factory(username="boss", staff=True, is_superuser=True)
    running = experiment_factory(owner=boss, status="running")
    done = experiment_factory(owner=boss, status="succeeded")
    response = logged_in(boss).post(
        "/admin/experiments/experiment/",
        {"action": "checkpoint_runs", "_selected_action": [running.pk, done.pk]},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert "Checkpoint requested of 1 run(s)." in shown
    assert any(m.startswith(f"#{done.pk}: the run is succeeded") for m in shown), shown
    running.refresh_from_db()
    assert running.checkpoint_requested_by == boss


def test_run_page_offers_checkpoint_now_while_running(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    running = experiment_factory(owner=alice, status="running")
    html = logged_in(alice).get(running.get_absolute_url()).content.decode()
    assert 'id="checkpoint-button"' in html and ">Checkpoint now</button>" in html
    assert f'data-url="/api/experiments/{running.pk}/checkpoint/"' in html
    ask(logged_in(alice), running)
    html = logged_in(alice).get(running.get_absolute_url()).content.decode()
    assert ">Checkpoint requested…</button>" in html
    # Queued: shown, but disabled until the run starts (the page enables it live).
    queued = experiment_factory(owner=alice)
    html = logged_in(alice).get(queued.get_absolute_url()).content.decode()
    button = html.split('id="checkpoint-button"')[1].split(">")[0]
    assert "disabled" in button
    done = experiment_factory(owner=alice, status="succeeded")
    html = logged_in(alice).get(done.get_absolute_url()).content.decode()
    assert 'id="checkpoint-button"' not in html


def test_a_request_the_run_ended_before_answering_is_dropped(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory(), status="running", attempt=1)
    body = asked_then_ended(run, ask).get(f"/api/experiments/{run.pk}/").json()
    assert body["status"] == "succeeded" and body["checkpoint_requested"] is False


def test_the_signal_goes_only_to_a_process_of_the_run() -> None:
    """A reported PID may have ended and been reused: only the run's own tree is signalled."""
    launcher = subprocess.Popen(  # noqa: S603 - a fixed command
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"]
    )
    try:
        child = wait_for(
            lambda: psutil.Process(launcher.pid).children(), timeout=10, what="the child"
        )[0]
        # Signal 0 checks delivery without doing anything.
        assert process_in_tree_signal(root_pid=launcher.pid, pid=child.pid, signum=0)
        assert process_in_tree_signal(root_pid=launcher.pid, pid=launcher.pid, signum=0)
        assert not process_in_tree_signal(root_pid=launcher.pid, pid=os.getpid(), signum=0)
        assert not process_in_tree_signal(root_pid=launcher.pid, pid=1, signum=signal.SIGUSR1)
    finally:
        for process in psutil.Process(launcher.pid).children(recursive=True):
            process.kill()
        launcher.kill()
        launcher.wait()
    assert not process_in_tree_signal(root_pid=launcher.pid, pid=launcher.pid, signum=0)
