"""The claim order and the running limit, through claim.experiment_claim on the real database;
fair queues (issue 35 item 2): a bound on each user's runs queued or running that studies obey,
users taking turns on the machines, and waiting runs woken instead of polling. The task itself
is called in this process, as a worker's pool child calls it; the messages it sends are caught
as Celery publishes them (its before_task_publish signal) to this process's in-memory broker.

The end-to-end checks (a Celery worker, Redis, the page) are in tests/test_queue_stack.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery.signals import before_task_publish
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from dashboard.devices.facts import machine_name, machine_queue
from dashboard.devices.models import WorkerMachine
from dashboard.devices.reporter import machine_report_save
from dashboard.experiments import tasks
from dashboard.experiments.core.limits import LaunchLimited, launch_slot_claim
from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.runs.lifecycle import run_finish
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.slurm import job as slurm_job
from dashboard.experiments.runs.slurm.step import SlurmStep
from dashboard.experiments.scheduling.allocation import Machine
from dashboard.experiments.scheduling.queue import ordinal, queue_heads_for, queue_ordered
from dashboard.experiments.services import experiment_clone, experiment_stop
from dashboard.experiments.tasks import reap_lost_runs, run_experiment
from dashboard.studies.models import Study, StudyRun
from dashboard.texts import QUEUE_ORDER
from tests.slurm_fake import slurm_fake_install

pytestmark = pytest.mark.django_db

TWO_CORES = Machine("m1", 2, frozenset())


@pytest.fixture(autouse=True)
def _whole_machine_runs(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    # A one-process CPU run takes both cores: one run at a time on TWO_CORES.
    monkeypatch.setenv("TRAINYARD_CPU_THREADS_PER_RUN", "2")
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 0


def queued(factory: Any, owner: Any, name: str, **fields: Any) -> Experiment:
    return factory(owner=owner, name=name, strategy="single", processes=1, **fields)


def claim(run: Experiment, machine: Machine = TWO_CORES) -> tuple[bool, str]:
    result = experiment_claim(experiment_id=run.pk, machine=machine)
    return result.claimed, result.waiting_reason


def test_a_later_run_waits_behind_an_earlier_one(user_factory: Any, experiment_factory: Any):
    alice = user_factory()
    a, b, c = (queued(experiment_factory, alice, n) for n in "abc")
    # C's message comes first to the free machine: it must not overtake A and B.
    claimed, reason = claim(c)
    assert not claimed
    assert reason == f"waiting behind #{a.pk}, whose turn on m1 comes first; 3rd in the queue"
    assert Experiment.objects.get(pk=c.pk).waiting_reason == reason
    assert claim(b) == (
        False,
        f"waiting behind #{a.pk}, whose turn on m1 comes first; 2nd in the queue",
    )
    assert claim(a) == (True, "")
    # Now B is first in line; what holds it is the machine's cores, said by the allocation.
    claimed, reason = claim(b)
    assert (
        not claimed and reason.startswith("waiting for 2 CPU cores on m1") and f"#{a.pk}" in reason
    )
    claimed, reason = claim(c)
    assert reason.startswith(f"waiting behind #{b.pk}")


def test_priority_jumps_the_queue(user_factory: Any, experiment_factory: Any):
    alice = user_factory()
    a, b = queued(experiment_factory, alice, "a"), queued(experiment_factory, alice, "b")
    urgent = queued(experiment_factory, alice, "urgent", priority=5)
    assert list(queue_ordered()) == [urgent, a, b]
    assert claim(a)[1].startswith(f"waiting behind #{urgent.pk}")
    assert claim(urgent) == (True, "")


def test_runs_that_cannot_use_this_machine_hold_nobody_up(
    user_factory: Any, experiment_factory: Any
):
    alice = user_factory()
    queued(experiment_factory, alice, "pinned elsewhere", machines=["m2"])
    queued(experiment_factory, alice, "wants a GPU m1 lacks", gpus=[0])
    later = queued(experiment_factory, alice, "later")
    assert claim(later) == (True, "")


def test_a_gpu_run_and_a_cpu_run_do_not_compete(user_factory: Any, experiment_factory: Any):
    alice = user_factory()
    gpu_machine = Machine("g1", 2, frozenset({0, 1}))
    on_gpu = queued(experiment_factory, alice, "on GPU 0", gpus=[0])
    other_gpu = queued(experiment_factory, alice, "on GPU 1", gpus=[1])
    same_gpu = queued(experiment_factory, alice, "also GPU 0", gpus=[0])
    cpu = queued(experiment_factory, alice, "cpu")
    assert claim(cpu, gpu_machine) == (True, "")
    assert claim(other_gpu, gpu_machine) == (True, "")
    assert claim(same_gpu, gpu_machine)[1].startswith(f"waiting behind #{on_gpu.pk}")


def test_the_running_limit_holds_at_claim_time(
    user_factory: Any, experiment_factory: Any, settings: Any
):
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 1
    alice, bob = user_factory(), user_factory()
    wide = Machine("wide", 64, frozenset())
    first, second = queued(experiment_factory, alice, "1"), queued(experiment_factory, alice, "2")
    bobs = queued(experiment_factory, bob, "bob's")
    assert claim(first, wide) == (True, "")
    claimed, reason = claim(second, wide)
    assert not claimed
    assert reason.startswith("waiting for one of its owner's runs to end: 1 running")
    assert "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER" in reason
    # Alice's waiting run does not hold Bob's up: it could not start anyway.
    assert claim(bobs, wide) == (True, "")
    Experiment.objects.filter(pk=first.pk).update(status=Status.SUCCEEDED)
    assert claim(second, wide) == (True, "")


def test_a_study_launch_queues_past_the_active_limit(
    user_factory: Any, experiment_factory: Any, settings: Any
):
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 2
    settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE = 0
    alice = user_factory()
    for name in "ab":
        queued(experiment_factory, alice, name)
    with pytest.raises(LaunchLimited) as refused:
        launch_slot_claim(owner=alice)
    assert refused.value.limit == "active_runs"
    launch_slot_claim(owner=alice, queue_over_active=True)  # no raise: the runs will queue
    settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE = 2
    with pytest.raises(LaunchLimited) as refused:
        launch_slot_claim(owner=alice, queue_over_active=True)
    assert refused.value.limit == "launch_rate"


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th",
    ]  # fmt: skip


# ---- GET /api/queue/ and the priority route -------------------------------------------------


def _listing(client: Any, user: Any) -> dict[str, Any]:
    client.force_login(user)
    response = client.get("/api/queue/")
    assert response.status_code == 200
    return response.json()


def test_the_queue_in_claim_order_with_positions_and_reasons(
    client: Any, user_factory: Any, experiment_factory: Any
):
    alice, bob, root = user_factory(), user_factory(), user_factory(staff=True)
    a1 = queued(experiment_factory, alice, "alice first")
    b1 = queued(experiment_factory, bob, "bob's")
    a2 = queued(experiment_factory, alice, "alice second")
    claim(b1)  # waits behind alice's first: the reason names her run
    listing = _listing(client, root)
    assert [(e["id"], e["position"]) for e in listing["queue"]] == [
        (a1.pk, 1),
        (b1.pk, 2),
        (a2.pk, 3),
    ]
    assert listing["queue"][1]["reason"].startswith(f"waiting behind #{a1.pk}")
    assert listing["total"] == 3 and listing["can_set_priority"] is True
    # Bob sees his run, its place among everyone's, and nothing of Alice's.
    listing = _listing(client, bob)
    (entry,) = listing["queue"]
    assert (entry["id"], entry["position"], entry["ahead"]) == (b1.pk, 2, 1)
    assert entry["ahead_text"] == "1 run ahead"
    assert entry["reason"].startswith("waiting behind another user's run, whose turn")
    assert listing["total"] == 3 and listing["can_set_priority"] is False
    text = json.dumps(listing)
    assert alice.username not in text and "alice" not in text and f"#{a1.pk}" not in text
    assert (
        _listing(client, alice)["summary"]
        == "3 runs queued in all; 2 of them yours (only yours are shown)."
    )


def test_only_staff_set_priority(client: Any, user_factory: Any, experiment_factory: Any):
    alice, root = user_factory(), user_factory(staff=True)
    first, second = queued(experiment_factory, alice, "1"), queued(experiment_factory, alice, "2")
    client.force_login(alice)
    url = f"/api/queue/{second.pk}/priority/"
    response = client.post(url, {"priority": 5}, content_type="application/json")
    assert response.status_code == 403 and "staff" in response.json()["error"]
    assert Experiment.objects.get(pk=second.pk).priority == 0
    client.force_login(root)
    for bad in ("5", 1.5, True, 10_000, None):
        response = client.post(url, {"priority": bad}, content_type="application/json")
        assert response.status_code == 400, bad
    response = client.post(url, {"priority": 5}, content_type="application/json")
    assert response.status_code == 200
    assert (response.json()["position"], response.json()["priority"]) == (1, 5)
    assert [e["id"] for e in _listing(client, root)["queue"]] == [second.pk, first.pk]
    Experiment.objects.filter(pk=first.pk).update(status=Status.SUCCEEDED)
    response = client.post(
        f"/api/queue/{first.pk}/priority/", {"priority": 1}, content_type="application/json"
    )
    assert response.status_code == 409
    assert (
        client.post(
            "/api/queue/999999/priority/", {"priority": 1}, content_type="application/json"
        ).status_code
        == 404
    )


def test_staff_set_priority_in_the_admin(client: Any, user_factory: Any, experiment_factory: Any):
    root = user_factory(staff=True, is_superuser=True)
    run = queued(experiment_factory, root, "from the admin")
    client.force_login(root)
    page = client.get(f"/admin/experiments/experiment/{run.pk}/change/")
    assert page.status_code == 200 and b'name="priority"' in page.content


def test_estimates_replay_the_queue_from_the_running_runs_progress(
    client: Any, user_factory: Any, experiment_factory: Any
):
    alice, root = user_factory(), user_factory(staff=True)
    now = timezone.now()
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=now)
    # Half way after 100 s: expected to end 100 s from now.
    queued(
        experiment_factory, alice, "running", status=Status.RUNNING, worker="m1", step=50,
        total_steps=100, started_at=now - timedelta(seconds=100),
    )  # fmt: skip
    # A finished run like the first queued one took 60 s; nothing like the third has finished.
    queued(
        experiment_factory, alice, "done", status=Status.SUCCEEDED, epochs=1,
        started_at=now - timedelta(seconds=600), finished_at=now - timedelta(seconds=540),
    )  # fmt: skip
    first = queued(experiment_factory, alice, "first", epochs=1)
    second = queued(experiment_factory, alice, "second", epochs=2)
    third = queued(experiment_factory, alice, "third", epochs=1)
    starts = {e["id"]: e["estimated_start_seconds"] for e in _listing(client, root)["queue"]}
    # Each takes the whole machine (two threads): one after another.
    assert starts[first.pk] == pytest.approx(100, abs=5)
    assert starts[second.pk] == pytest.approx(160, abs=5)
    assert starts[third.pk] is None  # waits for the second, whose length nobody knows


def test_each_estimate_says_its_basis_and_a_first_step_is_no_pace(
    client: Any, user_factory: Any, experiment_factory: Any
):
    """Issue 34 item 11: a run one step in (its time mostly start-up) is not extrapolated; the
    estimate rests on finished runs like it, or there is none, and each says which."""
    alice, root = user_factory(), user_factory(staff=True)
    now = timezone.now()
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=now)
    # One step of 200 after 10 s: extrapolated, 33 minutes; nothing like it finished: unknown.
    running = queued(
        experiment_factory, alice, "running", status=Status.RUNNING, worker="m1", step=1,
        total_steps=200, started_at=now - timedelta(seconds=10), epochs=3,
    )  # fmt: skip
    waiting = queued(experiment_factory, alice, "waiting", epochs=1)
    entry = _listing(client, root)["queue"][0]
    assert entry["id"] == waiting.pk
    assert entry["estimated_start_seconds"] is None
    assert entry["estimated_start_basis"].startswith("no estimate")
    # A finished run like it took 60 s: the running one is expected to end 50 s from now.
    queued(
        experiment_factory, alice, "done", status=Status.SUCCEEDED, worker="m1", epochs=3,
        started_at=now - timedelta(seconds=600), finished_at=now - timedelta(seconds=540),
    )  # fmt: skip
    entry = _listing(client, root)["queue"][0]
    assert entry["estimated_start_seconds"] == pytest.approx(50, abs=5)
    assert entry["estimated_start_basis"] == (
        f"when #{running.pk} ends 1m 00s after its start, as the last finished run like it took"
    )
    # A tenth of the way through, its pace says when it ends.
    Experiment.objects.filter(pk=running.pk).update(step=20)
    entry = _listing(client, root)["queue"][0]
    assert entry["estimated_start_seconds"] == pytest.approx(90, abs=5)
    assert entry["estimated_start_basis"] == (
        f"when #{running.pk} ends at its pace so far (20 of 200 steps in 10s)"
    )
    # Alice sees no other user's run number in it; an idle machine starts a run now.
    Experiment.objects.filter(pk=running.pk).update(owner=root)
    entry = _listing(client, alice)["queue"][0]
    assert f"#{running.pk}" not in entry["estimated_start_basis"]
    Experiment.objects.filter(pk=running.pk).update(status=Status.SUCCEEDED)
    assert _listing(client, alice)["queue"][0]["estimated_start_basis"] == (
        "its devices are free now"
    )


def test_stop_and_cancel_ask_first_for_a_run_launched_long_ago(
    client: Any, user_factory: Any, experiment_factory: Any
):
    """Issue 34 item 10: the queue's Cancel and the run page's Stop carry the question and the
    moment from which it is asked (launch + LONG_RUN_SECONDS); the page's script asks then."""
    from dashboard.texts import LONG_RUN_SECONDS

    alice = user_factory()
    waiting = queued(experiment_factory, alice, "long wait")
    entry = _listing(client, alice)["queue"][0]
    ask = entry["cancel_confirm"]
    assert ask["from"] == pytest.approx(waiting.created_at.timestamp() + LONG_RUN_SECONDS)
    assert ask["text"].startswith("Cancel “long wait”? It has waited in the queue for 5 minutes")
    running = queued(
        experiment_factory, alice, "long run", status=Status.RUNNING, worker="m1",
        started_at=timezone.now(),
    )  # fmt: skip
    page = client.get(running.get_absolute_url()).content.decode()
    start = int(running.created_at.timestamp() + LONG_RUN_SECONDS)
    assert f'data-confirm-from="{start}"' in page
    assert 'data-confirm-text="End “long run”? It was launched 5 minutes or more ago' in page


def test_the_run_woken_when_a_machine_frees_is_the_first_that_could_start_there(
    user_factory: Any, experiment_factory: Any, settings: Any
):
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 1
    alice, bob = user_factory(), user_factory()
    queued(experiment_factory, alice, "running", status=Status.RUNNING, worker="m2")
    queued(experiment_factory, bob, "pinned to m2", machines=["m2"])
    alices = queued(experiment_factory, alice, "alice is at her limit")
    bobs = queued(experiment_factory, bob, "bob's")
    assert queue_heads_for(worker="m1") == [bobs]
    # Without the limit, turns alternate: Bob's first (he has none running) is his run waiting
    # for m2, then Alice's comes before his second.
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 0
    assert queue_heads_for(worker="m1") == [alices]
    assert [run.name for run in queue_heads_for(worker="m2")] == ["pinned to m2"]


def test_a_run_waiting_for_machines_that_are_not_online_holds_nobody_up(
    user_factory: Any, experiment_factory: Any
):
    alice, bob = user_factory(), user_factory()
    # m1 is the only machine online: neither can start until another worker joins.
    two = experiment_factory(owner=alice, name="two machines", strategy="ddp", processes=1, nodes=2)
    experiment_factory(
        owner=alice, name="pinned to an offline one", strategy="ddp", processes=1, nodes=2,
        machines=["m1", "m2"],
    )  # fmt: skip
    later = queued(experiment_factory, bob, "later")
    claimed, reason = claim(two)
    assert not claimed and "waiting behind" not in reason
    assert claim(later) == (True, "")
    # Once the second machine reports, the two-machine runs come first again.
    WorkerMachine.objects.create(hostname="m2", reported_at=timezone.now(), report={})
    after = queued(experiment_factory, bob, "after")
    assert claim(after)[1].startswith(f"waiting behind #{two.pk}")


def test_the_run_woken_never_wants_gpus_the_freed_machine_lacks(
    user_factory: Any, experiment_factory: Any
):
    alice = user_factory()
    WorkerMachine.objects.create(hostname="m1", reported_at=timezone.now(), report={"cpu_count": 2})
    queued(experiment_factory, alice, "wants GPU 3", gpus=[3])
    cpu = queued(experiment_factory, alice, "cpu")
    assert queue_heads_for(worker="m1") == [cpu]


@pytest.fixture
def published() -> Iterator[list[dict[str, Any]]]:
    """Every run_experiment message this process publishes meanwhile (a run's end also queues
    its notification, which is not the queue's): its arguments and queue."""
    sent: list[dict[str, Any]] = []

    def record(sender: str, body: Any, routing_key: str, **kwargs: Any) -> None:
        if sender != run_experiment.name:
            return
        args, task_kwargs, _ = body
        sent.append({"task": sender, "args": list(args), "kwargs": task_kwargs,
                     "queue": routing_key})  # fmt: skip

    before_task_publish.connect(record, weak=False)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(record)


# ---- fair queues (issue 35 item 2): users take turns -------------------------------------


def test_two_users_sharing_one_machine_take_turns(user_factory: Any, experiment_factory: Any):
    """Alice queues 4 runs, then Bob 2, on a machine that runs one at a time. First in, first
    out ran all of Alice's before Bob's first; the turns alternate."""
    alice, bob = user_factory(), user_factory()
    a1, a2, a3, a4 = (queued(experiment_factory, alice, f"a{n}") for n in range(1, 5))
    b1, b2 = (queued(experiment_factory, bob, f"b{n}") for n in range(1, 3))
    launched = [a1, a2, a3, a4, b1, b2]
    started: list[Experiment] = []
    while len(started) < len(launched):
        # Every queued run's claim, in launch order (the worst case for Bob): one starts.
        claims = [(r, experiment_claim(experiment_id=r.pk, machine=TWO_CORES)) for r in launched]
        (winner,) = [run for run, claim in claims if claim.claimed]
        started.append(winner)
        Experiment.objects.filter(pk=winner.pk).update(
            status=Status.SUCCEEDED, finished_at=timezone.now()
        )
    assert started == [a1, b1, a2, b2, a3, a4]
    assert started.index(b1) < started.index(a3)


def test_a_script_reporting_from_elsewhere_is_no_turn_taken(
    user_factory: Any, experiment_factory: Any
):
    """Turns go first to whoever the machines served least lately. A run reported from outside
    holds no worker (it counts in no one's runs running): its start is no turn on the machines,
    or a user's own scripts elsewhere would put her behind everyone here."""
    alice, bob = user_factory(), user_factory()
    hour_ago = timezone.now() - timedelta(hours=1)
    queued(experiment_factory, bob, "b0", status=Status.SUCCEEDED, started_at=hour_ago)
    a1, b1 = queued(experiment_factory, alice, "a1"), queued(experiment_factory, bob, "b1")
    queued(experiment_factory, alice, "her script elsewhere", status=Status.RUNNING,
           reported=True, attempt=1, started_at=timezone.now())  # fmt: skip
    assert queue_ordered() == [a1, b1]


def test_a_waiting_run_says_whose_turn_comes_first(
    user_factory: Any, experiment_factory: Any, client: Client
):
    alice, bob, root = user_factory(), user_factory(), user_factory(staff=True)
    a1, a2 = queued(experiment_factory, alice, "a1"), queued(experiment_factory, alice, "a2")
    b1 = queued(experiment_factory, bob, "b1")
    assert experiment_claim(experiment_id=a1.pk, machine=TWO_CORES).claimed
    # Alice has one running: Bob's run comes before her second, though launched after it.
    assert queue_ordered() == [b1, a2]
    claim = experiment_claim(experiment_id=a2.pk, machine=TWO_CORES)
    assert claim.waiting_reason == (
        f"waiting behind #{b1.pk}, whose turn on m1 comes first; 2nd in the queue"
    )
    # The page's JSON: its order in a line, and, added to each entry, what the turn rests on.
    client.force_login(root)
    listing = client.get("/api/queue/").json()
    assert listing["order"] == QUEUE_ORDER and "fewest runs running" in listing["order"]
    entries = [(e["id"], e["position"], e["owner_running"], e["owner_position"])
               for e in listing["queue"]]  # fmt: skip
    assert entries == [(b1.pk, 1, 0, 1), (a2.pk, 2, 1, 1)]
    page = client.get("/queue/").content.decode()
    assert 'id="queue-order"' in page and "fewest runs running" in page


# ---- the bound on runs queued or running -------------------------------------------------

STUDY = {
    "name": "grid",
    "base": {"dataset": "mnist", "epochs": 1, "batch_size": 64},
    "axes": {"strategy": ["single", "ddp"], "seed": [1, 2]},  # 4 runs
    "target_accuracy": 0.9,
}


def study_post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(reverse("api-studies"), json.dumps(body), content_type="application/json")


def test_a_study_past_the_users_bound_is_refused_whole(
    alice_client: Client, alice: Any, experiment_factory: Any, settings: Any, launched: list[int]
):
    """On main a study skipped the per-user limit: any number of runs queued at once."""
    settings.TRAINYARD_MAX_QUEUED_RUNS_PER_USER = 5
    for name in ("running", "queued"):
        queued(experiment_factory, alice, name)
    refused = study_post(alice_client, STUDY)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert "TRAINYARD_MAX_QUEUED_RUNS_PER_USER" in error and "is 5" in error
    assert "these 4 runs do not fit: you have 2 runs queued or running" in error
    assert "room for 3 now" in error
    assert Study.objects.count() == 0 and Experiment.objects.count() == 2  # nothing stored
    # More runs than the bound itself: never, however long the user waits.
    settings.TRAINYARD_MAX_QUEUED_RUNS_PER_USER = 3
    Experiment.objects.update(status=Status.SUCCEEDED)
    refused = study_post(alice_client, STUDY)
    assert refused.status_code == 409 and "can never all be queued" in refused.json()["error"]
    # Room for all four: the study is launched.
    settings.TRAINYARD_MAX_QUEUED_RUNS_PER_USER = 6
    assert study_post(alice_client, STUDY).status_code == 201
    assert Experiment.objects.filter(status=Status.QUEUED).count() == 4


def test_every_launch_obeys_the_bound(
    alice_client: Client, alice: Any, experiment_factory: Any, settings: Any, launched: list[int]
):
    """One launch (the API, the form, Run again) past the bound: 429 as the other limits, with
    Retry-After, even where the active-run limit is off."""
    settings.TRAINYARD_MAX_QUEUED_RUNS_PER_USER = 2
    first = queued(experiment_factory, alice, "one")
    launch = {"name": "two", "strategy": "single"}
    answer = alice_client.post(
        reverse("api-experiments"), json.dumps(launch), content_type="application/json"
    )
    assert answer.status_code == 201
    answer = alice_client.post(
        reverse("api-experiments"), json.dumps(launch), content_type="application/json"
    )
    assert answer.status_code == 429 and answer.json()["limit"] == "queued_runs"
    assert int(answer["Retry-After"]) > 0
    assert "TRAINYARD_MAX_QUEUED_RUNS_PER_USER" in answer.json()["error"]
    with pytest.raises(LaunchLimited) as again:
        experiment_clone(experiment=first, owner=alice)
    assert again.value.limit == "queued_runs"
    assert Experiment.objects.filter(owner=alice).count() == 2


# ---- waiting without polling -------------------------------------------------------------


def test_a_waiting_run_is_woken_not_polled(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
    monkeypatch: pytest.MonkeyPatch,
):
    """On main a waiting run's task retried its locking claim every
    TRAINYARD_WAIT_RETRY_SECONDS for as long as it waited. Now its task ends and sends nothing;
    the run's end that frees the machine wakes it, on that machine's queue."""
    monkeypatch.setenv("TRAINYARD_CPU_THREADS_PER_RUN", "1000")  # every core of this machine
    here = machine_name()
    WorkerMachine.objects.create(hostname=here, report={"cpu_count": 2}, reported_at=timezone.now())
    alice, bob = user_factory(), user_factory()
    busy = experiment_factory(
        owner=alice, name="holding every core", strategy="single", processes=1,
        status=Status.RUNNING, worker=here, placement=[{"worker": here}], started_at=timezone.now(),
    )  # fmt: skip
    waiting = queued(experiment_factory, bob, "waits")
    assert run_experiment(waiting.pk) is None  # its first claim: no retry raised
    assert run_experiment(waiting.pk, wake=True) is None  # a wake-up too early: the same
    waiting.refresh_from_db()
    assert waiting.status == Status.QUEUED and "CPU core" in waiting.waiting_reason
    assert published == []  # nothing comes back to ask again
    with django_capture_on_commit_callbacks(execute=True):
        run_finish(experiment=busy, sink=EventSink(busy), outcome=Outcome(Status.SUCCEEDED))
    assert published == [
        {"task": "experiments.run_experiment", "args": [waiting.pk], "kwargs": {"wake": True},
         "queue": machine_queue(here)},
    ]  # fmt: skip


def test_a_cancelled_run_lets_the_next_in_turn_be_woken(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
):
    """A queued run cancelled frees no device, but the run behind it may now be first."""
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=timezone.now())
    alice, bob = user_factory(), user_factory()
    first, behind = queued(experiment_factory, alice, "first"), queued(experiment_factory, bob, "2")
    claim = experiment_claim(experiment_id=behind.pk, machine=TWO_CORES)
    assert claim.waiting_reason.startswith(f"waiting behind #{first.pk}")
    with django_capture_on_commit_callbacks(execute=True):
        assert experiment_stop(experiment=first, by=alice)
    assert [(m["args"], m["queue"]) for m in published] == [([behind.pk], machine_queue("m1"))]


def test_a_run_that_starts_wakes_the_run_it_held_up_on_another_machine(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
):
    """Two runs' first messages reach two idle machines' workers at once, the second's claim
    first: it waits behind the first, whose turn on m2 comes first. The first then starts here;
    the second must be woken on m2 at once, not a minute later by the reaper's net."""
    monkeypatch.setenv("TRAINYARD_CPU_THREADS_PER_RUN", "1000")  # every core of a machine
    here = machine_name()
    for host in (here, "m2"):
        WorkerMachine.objects.create(
            hostname=host, report={"cpu_count": 2}, reported_at=timezone.now()
        )
    alice = user_factory()
    first, second = queued(experiment_factory, alice, "1"), queued(experiment_factory, alice, "2")
    on_m2 = experiment_claim(experiment_id=second.pk, machine=Machine("m2", 2, frozenset()))
    assert on_m2.waiting_reason.startswith(f"waiting behind #{first.pk}, whose turn on m2")
    # The training itself is not this test's: the claim and the messages it sends are.
    monkeypatch.setattr(tasks, "experiment_supervise", lambda **kwargs: None)
    run_experiment(first.pk)
    assert Experiment.objects.get(pk=first.pk).status == Status.RUNNING
    woken = [(m["args"], m["queue"]) for m in published]
    assert ([second.pk], machine_queue("m2")) in woken, woken


def test_a_first_claim_held_up_here_is_woken_where_it_is_its_turn(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
):
    """A run's first message reaches this machine's worker, where a run pinned here (a resume
    pinned to its checkpoint's machine) waits first for the cores; m2 is idle and it is the
    run's turn there. Nothing will end to wake it: it must be sent to m2 now."""
    monkeypatch.setenv("TRAINYARD_CPU_THREADS_PER_RUN", "1000")
    here = machine_name()
    for host in (here, "m2"):
        WorkerMachine.objects.create(
            hostname=host, report={"cpu_count": 2}, reported_at=timezone.now()
        )
    alice, bob, carol = user_factory(), user_factory(), user_factory()
    queued(experiment_factory, carol, "holding here", status=Status.RUNNING, worker=here,
           placement=[{"worker": here}], started_at=timezone.now())  # fmt: skip
    pinned = queued(experiment_factory, alice, "pinned here", machines=[here])
    assert run_experiment(pinned.pk) is None  # waits for the cores here
    later = queued(experiment_factory, bob, "may go anywhere")
    assert run_experiment(later.pk) is None
    later.refresh_from_db()
    assert later.waiting_reason.startswith(f"waiting behind #{pinned.pk}, whose turn on {here}")
    woken = [(m["args"], m["queue"]) for m in published]
    assert woken == [([later.pk], machine_queue("m2"))]


def test_a_study_stopped_wakes_the_queue_once_not_once_a_run(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    client: Client,
    django_capture_on_commit_callbacks: Any,
):
    """A study's queued runs cancelled together: one wake pass for all of them (each pass reads
    the whole queue and rewrites the reasons that moved: one a run made stopping a study of 48
    queued runs take 28 s here, 60 s with 100 other runs queued; 1 s before the wakes)."""
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=timezone.now())
    alice, bob = user_factory(), user_factory()
    study = Study.objects.create(owner=alice, name="s", base={}, axes={}, target_accuracy=0.9)
    for position in range(4):
        run = queued(experiment_factory, alice, f"a{position}")
        StudyRun.objects.create(study=study, experiment=run, position=position, values={})
    behind = queued(experiment_factory, bob, "behind the study")
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(reverse("api-study-stop", args=[study.pk]))
    assert answer.status_code == 200 and len(answer.json()["stopping"]) == 4
    # Not each of Alice's next runs in turn, about to be cancelled too: Bob's, once.
    assert [(m["args"], m["queue"]) for m in published] == [([behind.pk], machine_queue("m1"))]


def test_a_reported_runs_end_wakes_nobody(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
):
    """A script reporting from elsewhere holds no worker: its end (a request of its own) frees
    nothing in the queue and must not cost a pass over it."""
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=timezone.now())
    alice = user_factory()
    elsewhere = queued(experiment_factory, alice, "reported", status=Status.RUNNING,
                       reported=True, attempt=1, started_at=timezone.now())  # fmt: skip
    queued(experiment_factory, alice, "waits")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run_finish(
            experiment=elsewhere, sink=EventSink(elsewhere), outcome=Outcome(Status.SUCCEEDED)
        )
    assert Experiment.objects.get(pk=elsewhere.pk).status == Status.SUCCEEDED
    assert published == [] and tasks.queue_wake_send not in callbacks


def test_a_started_run_is_supervised_before_the_places_behind_it_are_rewritten(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
):
    """A start moves the place of every run behind it. Written and told to each run's page in
    the wake that follows (~10 ms a run), 640 runs queued kept a run just started from its
    supervisor for 8 s (its heartbeat's bound is 30 s), and a Stop of the head took 17 s in its
    request. The wakes write no reasons; the reaper's beat writes those that moved."""
    monkeypatch.setenv("TRAINYARD_CPU_THREADS_PER_RUN", "1000")
    here = machine_name()
    WorkerMachine.objects.create(hostname=here, report={"cpu_count": 2}, reported_at=timezone.now())
    alice = user_factory()
    head = queued(experiment_factory, alice, "head")
    behind = [queued(experiment_factory, alice, f"behind {n}") for n in range(30)]
    reap_lost_runs()  # the beat: each run behind says its place (and the head is woken)
    published.clear()
    said = Experiment.objects.get(pk=behind[1].pk).waiting_reason
    assert said == f"waiting behind #{head.pk}, whose turn on {here} comes first; 3rd in the queue"
    before_supervising: list[int] = []
    with CaptureQueriesContext(connection) as queries:
        monkeypatch.setattr(tasks, "experiment_supervise",
                            lambda **kwargs: before_supervising.append(len(queries)))  # fmt: skip
        run_experiment(head.pk)
    assert Experiment.objects.get(pk=head.pk).status == Status.RUNNING
    # A few queries for the claim and the wake, not some for each of the 30 runs behind.
    assert before_supervising[0] < 45, [q["sql"] for q in queries.captured_queries]
    assert [m["args"] for m in published] == [[behind[0].pk]]  # woken: its turn, maybe room
    reap_lost_runs()
    said = Experiment.objects.get(pk=behind[1].pk).waiting_reason
    assert said == (
        f"waiting behind #{behind[0].pk}, whose turn on {here} comes first; 2nd in the queue"
    )


def test_the_reapers_net_wakes_only_whose_turn_it_is(
    user_factory: Any, experiment_factory: Any, published: list[dict[str, Any]], settings: Any
):
    """A wake lost with the broker's messages: the beat wakes the run whose turn it is once its
    last claim is older than TRAINYARD_REDISPATCH_SECONDS, not every waiting run, and not again
    at once. On main it sent every queued run not claimed for a minute."""
    settings.TRAINYARD_REDISPATCH_SECONDS = 60
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=timezone.now())
    alice = user_factory()
    blocker = queued(experiment_factory, alice, "holds m1")
    assert experiment_claim(experiment_id=blocker.pk, machine=TWO_CORES).claimed
    head, behind = queued(experiment_factory, alice, "head"), queued(experiment_factory, alice, "2")
    for run in (head, behind):  # each tried once: they wait
        assert experiment_claim(experiment_id=run.pk, machine=TWO_CORES).waiting_reason
    assert reap_lost_runs()["woken"] == []  # tried just now
    long_ago = timezone.now() - timedelta(minutes=5)
    Experiment.objects.filter(status=Status.QUEUED).update(heartbeat_at=long_ago)
    assert reap_lost_runs()["woken"] == [head.pk]
    assert [(m["args"], m["queue"]) for m in published] == [([head.pk], machine_queue("m1"))]
    assert reap_lost_runs()["woken"] == []  # and not again at once


def test_the_reapers_net_leaves_a_run_just_launched_to_its_own_task(
    user_factory: Any, experiment_factory: Any, published: list[dict[str, Any]], settings: Any
):
    """A run never tried counts from its creation: its launch's task is on its way, and the
    net's round a second later woke it on another machine's queue too (the stack's placement
    test saw the stack's worker take a run sent to its own machine's queue)."""
    settings.TRAINYARD_REDISPATCH_SECONDS = 60
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=timezone.now())
    fresh = queued(experiment_factory, user_factory(), "just launched")
    assert reap_lost_runs()["woken"] == [] and published == []
    # Its task lost with the broker's messages: a minute on, it is sent again, once.
    Experiment.objects.filter(pk=fresh.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert reap_lost_runs()["redispatched"] == [fresh.pk]
    assert reap_lost_runs() == {"lost": [], "requeued": [], "redispatched": [], "woken": []}


def test_a_worker_that_joins_wakes_the_run_whose_turn_it_is_there(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    django_capture_on_commit_callbacks: Any,
):
    alice = user_factory()
    waiting = queued(experiment_factory, alice, "waits for a machine")
    with django_capture_on_commit_callbacks(execute=True):
        machine_report_save(facts={"hostname": "m9", "cpu_count": 2})
        machine_report_save(facts={"hostname": "m9", "cpu_count": 2})  # online already: no wake
    assert [(m["args"], m["queue"]) for m in published] == [([waiting.pk], machine_queue("m9"))]


def test_a_slurm_run_that_starts_or_stops_to_resume_wakes_whose_turn_it_made(
    user_factory: Any,
    experiment_factory: Any,
    published: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    settings: Any,
):
    """Alice's Slurm run counts among her running runs, as the workers' turns count them. Bob's
    run waits behind hers on m1; her Slurm job starts: now Bob has fewer running, and his turn
    comes first. Nothing on the workers started or ended to wake it: the job's start does. Its
    stop to resume (sbatch's warning) moves her count back: the queue is woken again (Bob's
    turn still, as Alice was served last)."""
    settings.TRAINYARD_SLURM = True
    fake = slurm_fake_install(tmp_path, monkeypatch)
    fake.command("scontrol", answers={
        "show hostnames": "n1\n",
        "show node": "NodeName=n1 NodeAddr=127.0.0.1 NodeHostName=vm CPUTot=1 State=ALLOCATED\n",
    })  # fmt: skip
    WorkerMachine.objects.create(hostname="m1", report={"cpu_count": 2}, reported_at=timezone.now())
    alice, bob = user_factory(), user_factory()
    hers = queued(experiment_factory, alice, "on m1")
    his = queued(experiment_factory, bob, "behind hers")
    assert claim(his)[1].startswith(f"waiting behind #{hers.pk}, whose turn on m1")
    on_slurm = queued(experiment_factory, alice, "on Slurm", backend="slurm",
                      scheduler_job_id="21", heartbeat_at=timezone.now())  # fmt: skip
    monkeypatch.setenv("SLURM_JOB_ID", "21")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    # The training and the signals are not this test's: the claim and the wakes are.
    monkeypatch.setattr(SlurmStep, "signals_install", lambda self: None)
    stops = iter([Status.QUEUED])
    monkeypatch.setattr(slurm_job, "experiment_supervise", lambda **kwargs: next(stops))
    monkeypatch.setattr(slurm_job, "slurm_job_requeue", lambda job_id: None)
    assert tasks.slurm_job_supervise(experiment_id=on_slurm.pk) == Status.QUEUED
    woken = [(m["args"], m["queue"]) for m in published]
    assert woken == [([his.pk], machine_queue("m1"))] * 2, woken
