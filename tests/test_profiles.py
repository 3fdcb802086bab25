"""Profiles on request: the API's answers, the worker's storing (byte cap, the newest kept, files
gone with their row and their run), the trace summary's arithmetic, the run page's panel, and a
profile of a 2-rank DDP run through the live stack (request, recording, traces, summary)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dashboard.accounts.models import ApiToken
from dashboard.experiments.core.profiles import profiles_dir
from dashboard.experiments.models import Experiment, Profile, ProfileState
from dashboard.experiments.runs.profiles import profile_event_store, profiles_prune
from tests.factories import asked_then_ended, logged_in
from tests.stack import Stack, wait_for
from tests.test_browser import browser, log_in, page  # noqa: F401 - the browser's fixtures
from training.observe.trace_summary import overlap_of


def ask(client: Client, run: Experiment, body: Any = None, **headers: str) -> Any:
    data = json.dumps({"steps": 5} if body is None else body)
    return client.post(
        f"/api/experiments/{run.pk}/profile/", data, content_type="application/json", **headers
    )


@pytest.fixture
def runs_dir(settings: Any, tmp_path: Path) -> Path:
    settings.TRAINYARD_RUNS_DIR = tmp_path / "runs"
    return settings.TRAINYARD_RUNS_DIR


# ---- the API ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_running_run_takes_one_request_at_a_time(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice, bob = user_factory(), user_factory()
    run = experiment_factory(owner=alice, status="running")
    assert ask(logged_in(bob), run).status_code == 404
    response = ask(logged_in(alice), run, {"steps": 7})
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["state"], body["steps"], body["in_flight"]) == ("requested", 7, True)
    again = ask(logged_in(alice), run)
    assert again.status_code == 409 and "already being recorded" in again.json()["error"]
    # The list holds traces only: none until the profile is ready.
    assert logged_in(alice).get(f"/api/experiments/{run.pk}/profiles/").json() == []
    assert logged_in(bob).get(f"/api/experiments/{run.pk}/profiles/").status_code == 404
    latest = logged_in(alice).get(f"/api/experiments/{run.pk}/profiles/latest/").json()
    assert latest["profile"]["id"] == body["id"] and latest["profile"]["state"] == "requested"


@pytest.mark.django_db
@pytest.mark.parametrize("steps", [None, 0, 201, -3, "20", True, 2.5, [5]])
def test_steps_must_be_an_integer_from_1_to_200(
    user_factory: Any, experiment_factory: Any, steps: Any
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status="running")
    response = ask(logged_in(alice), run, {} if steps is None else {"steps": steps})
    assert response.status_code == 400
    assert "1 to 200" in response.json()["errors"]["steps"][0]
    assert not Profile.objects.filter(experiment=run).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "says"),
    [("queued", "has not started yet"), ("succeeded", "the run is succeeded"),
     ("failed", "only a running run can record a profile"), ("cancelled", "cancelled")],
)  # fmt: skip
def test_only_a_running_run_is_profiled(
    user_factory: Any, experiment_factory: Any, status: str, says: str
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status=status)
    response = ask(logged_in(alice), run)
    assert response.status_code == 409 and says in response.json()["error"]


@pytest.mark.django_db
def test_a_strategy_that_cannot_is_refused_with_the_registrys_reason(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status="running", strategy="hogwild")
    response = ask(logged_in(alice), run)
    assert response.status_code == 409
    assert "Hogwild cannot record a profile: it runs its own processes" in response.json()["error"]


@pytest.mark.django_db
def test_a_script_run_is_asked_where_its_launcher_takes_profiles_and_refused_where_not(
    user_factory: Any, experiment_factory: Any
) -> None:
    """A script's ranks record profiles (training/scripts/profiles.py) where its launcher named a
    profile_dir in its started event; its observer off, or reported from outside, it says why."""
    alice = user_factory()
    script = {"owner": alice, "status": "running", "strategy": "script", "entrypoint": "t.py"}
    starting = experiment_factory(**script)  # no started event yet: the supervisor waits for it
    taking = experiment_factory(**script, run_info={"strategy": "script", "profile_dir": "/p"})
    unobserved = experiment_factory(**script, run_info={"strategy": "script", "profile_dir": None})
    reported = experiment_factory(**script, reported=True)
    assert [ask(logged_in(alice), run).status_code for run in (starting, taking)] == [202, 202]
    html = logged_in(alice).get(unobserved.get_absolute_url()).content.decode()
    assert 'id="profile-button"' not in html and "TRAINYARD_OBSERVE=0" in html
    for run, says in (
        (unobserved, "its observer, which records them, is off"),
        (reported, "A run reported from outside cannot record a profile"),
    ):
        response = ask(logged_in(alice), run)
        assert response.status_code == 409 and says in response.json()["error"]


@pytest.mark.django_db
def test_a_token_may_ask(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, status="running")
    token = ApiToken.objects.create(user=alice)
    client = Client(enforce_csrf_checks=True)
    response = ask(client, run, HTTP_AUTHORIZATION=f"Bearer {token.key}")
    assert response.status_code == 202, response.content
    assert Client().post(f"/api/experiments/{run.pk}/profile/").status_code == 401


# ---- on the worker: the events, the cap, the newest kept, the files -----------------------------


def trace_file(run: Experiment, profile: int, rank: int, size: int) -> str:
    path = profiles_dir(experiment_id=run.pk) / str(profile) / f"rank-{rank}.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return str(path)


def ready_event(run: Experiment, profile: Profile, sizes: list[int]) -> dict[str, Any]:
    traces = [
        {"rank": r, "path": trace_file(run, profile.pk, r, size), "bytes": size}
        for r, size in enumerate(sizes)
    ]
    summary = [
        {"rank": r, "ops": [{"name": "aten::mm", "calls": 3, "self_cpu_seconds": 0.2,
                             "cpu_seconds": 0.3}],
         "wall_seconds": 1.0, "computation_seconds": 0.8, "communication_seconds": 0.25,
         "overlap_seconds": 0.05, "device": "cpu"}
        for r in range(len(sizes))
    ]  # fmt: skip
    return {
        "type": "profile", "profile": profile.pk, "state": "ready", "steps": 4, "first_step": 11,
        "recorded_steps": 4, "traces": traces, "summary": summary,
    }  # fmt: skip


@pytest.mark.django_db
def test_events_move_the_row_and_a_trace_over_the_cap_is_deleted(
    user_factory: Any, experiment_factory: Any, runs_dir: Path, settings: Any
) -> None:
    settings.TRAINYARD_PROFILE_MAX_BYTES = 1000
    alice = user_factory()
    run = experiment_factory(owner=alice, status="running")
    profile = Profile.objects.create(experiment=run, steps=4)
    recording = {"type": "profile", "profile": profile.pk, "state": "recording", "steps": 4,
                 "first_step": 11}  # fmt: skip
    assert profile_event_store(experiment=run, message=recording).state == "recording"
    stored = profile_event_store(experiment=run, message=ready_event(run, profile, [900, 1200]))
    assert stored is not None and stored.state == ProfileState.READY
    kept, over = stored.traces
    assert Path(kept["path"]).is_file() and kept["dropped"] == ""
    assert not Path(over["path"]).exists() and "over the cap of 1000 B" in over["dropped"]
    listed = logged_in(alice).get(f"/api/experiments/{run.pk}/profiles/").json()
    assert [(t["rank"], t["steps"], t["bytes"]) for t in listed] == [(0, 4, 900)]
    download = logged_in(alice).get(listed[0]["url"])
    assert download.status_code == 200 and download["Content-Type"] == "application/gzip"
    assert b"".join(download.streaming_content) == b"x" * 900
    assert ".json.gz" in download["Content-Disposition"]
    missing = logged_in(alice).get(listed[0]["url"].replace("/ranks/0/", "/ranks/1/"))
    assert missing.status_code == 404 and "dropped" in missing.json()["error"]
    summary = logged_in(alice).get(f"/api/experiments/{run.pk}/profiles/latest/").json()
    rank0 = summary["profile"]["summary"][0]
    assert (rank0["communication_text"], rank0["overlap_text"]) == ("25%", "20% of it hidden")


@pytest.mark.django_db
def test_only_the_newest_profiles_are_kept_and_the_rest_deleted_with_their_files(
    user_factory: Any,
    experiment_factory: Any,
    runs_dir: Path,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.TRAINYARD_PROFILES_KEPT = 3
    run = experiment_factory(owner=user_factory(), status="running")
    made = []
    for _ in range(5):
        profile = Profile.objects.create(experiment=run, steps=4)
        with django_capture_on_commit_callbacks(execute=True):  # the files go at commit
            profile_event_store(experiment=run, message=ready_event(run, profile, [100, 100]))
        made.append(profile.pk)
    left = list(Profile.objects.filter(experiment=run).values_list("pk", flat=True))
    assert sorted(left) == made[-3:]
    folders = sorted(p.name for p in profiles_dir(experiment_id=run.pk).iterdir())
    assert folders == sorted(str(pk) for pk in made[-3:])
    # One in flight is never pruned, and does not count among the kept.
    flying = Profile.objects.create(experiment=run, steps=4)
    assert profiles_prune(experiment_id=run.pk, keep=1) == made[-3:-1][::-1]
    assert set(Profile.objects.filter(experiment=run).values_list("pk", flat=True)) == {
        made[-1], flying.pk,
    }  # fmt: skip
    # Failed ones (recordings stopped or refused) do not count either: two of them, newer than
    # the one ready profile, leave it and its traces alone.
    flying.state = ProfileState.FAILED
    flying.save()
    Profile.objects.create(experiment=run, steps=4, state=ProfileState.FAILED)
    assert profiles_prune(experiment_id=run.pk, keep=1) == []
    assert (profiles_dir(experiment_id=run.pk) / str(made[-1])).is_dir()


@pytest.mark.django_db
def test_an_event_naming_a_file_outside_the_profile_never_deletes_it(
    user_factory: Any, experiment_factory: Any, runs_dir: Path, settings: Any
) -> None:
    settings.TRAINYARD_PROFILE_MAX_BYTES = 10
    run = experiment_factory(owner=user_factory(), status="running")
    profile = Profile.objects.create(experiment=run, steps=4)
    elsewhere = runs_dir / str(run.pk) / "checkpoints" / "epoch-1.pt"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_bytes(b"c" * 100)
    event = ready_event(run, profile, [5])
    event["traces"].append({"rank": 1, "path": str(elsewhere), "bytes": 100})
    event["traces"].append({"rank": 2, "path": str(profiles_dir(experiment_id=run.pk) / str(
        profile.pk) / ".." / ".." / "checkpoints" / "epoch-1.pt"), "bytes": 100})  # fmt: skip
    stored = profile_event_store(experiment=run, message=event)
    assert stored is not None and [bool(t["dropped"]) for t in stored.traces] == [False, True, True]
    assert elsewhere.read_bytes() == b"c" * 100
    # A list of traces that is not one is no traces, not a worker's TypeError.
    other = Profile.objects.create(experiment=run, steps=4)
    bad = {
        **ready_event(run, other, [5]),
        "traces": 7,
        "summary": [{"rank": 0, "wall_seconds": "x", "ops": [{"self_cpu_seconds": [1]}]}],
    }
    stored = profile_event_store(experiment=run, message=bad)
    assert stored is not None and stored.traces == []
    # Nor is a figure that is not a number a 500 where the page does arithmetic on it.
    assert stored.summary[0]["wall_seconds"] == 0.0
    assert stored.summary[0]["ops"][0]["self_cpu_seconds"] == 0.0


@pytest.mark.django_db
def test_deleting_the_run_deletes_its_profiles_files(
    user_factory: Any,
    experiment_factory: Any,
    runs_dir: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = experiment_factory(owner=user_factory(), status="running")
    profile = Profile.objects.create(experiment=run, steps=4)
    event = ready_event(run, profile, [100, 100])
    profile_event_store(experiment=run, message=event)
    assert all(Path(t["path"]).is_file() for t in event["traces"])
    folder = profiles_dir(experiment_id=run.pk)
    (folder / "request.json").write_text('{"profile": 1, "steps": 4}')  # the last request
    with django_capture_on_commit_callbacks(execute=False) as deferred:
        run.delete()
    assert folder.is_dir()  # until the delete commits: one that rolls back keeps its traces
    for callback in deferred:
        callback()
    assert not any(Path(t["path"]).exists() for t in event["traces"])
    assert not folder.exists() and not Profile.objects.exists()


@pytest.mark.django_db
def test_a_profile_in_flight_fails_when_the_attempt_ends(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory(), status="running", attempt=1)
    client = asked_then_ended(run, ask)
    latest = client.get(f"/api/experiments/{run.pk}/profiles/latest/").json()
    assert latest["profile"]["state"] == "failed" and latest["profile"]["in_flight"] is False
    assert "stopped (succeeded) before every rank" in latest["profile"]["state_text"]


# ---- the summary's arithmetic -------------------------------------------------------------------


def op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def test_communication_computation_and_overlap_from_the_trace_events() -> None:
    events = [
        op("ProfilerStep#1", 0, 1000, cat="user_annotation"),  # a step mark: no one's time
        op("aten::addmm", 0, 400),
        op("aten::mm", 100, 100),  # nested: counted once
        # Autograd's function runs DDP's hook: blocked in the collective 500..600.
        op("autograd::engine::evaluate_function", 450, 300),
        op("c10d::allreduce_", 500, 100),
        op("gloo:all_reduce", 550, 350, tid=2),  # Gloo's thread, while backward goes on
        {"ph": "i", "name": "marker", "ts": 5},  # not a complete event
    ]
    found = overlap_of(events)
    us = 1e-6
    assert found.device == "cpu"
    assert found.computation == pytest.approx((400 + 50 + 150) * us)  # 0-400, 450-500, 600-750
    assert found.communication == pytest.approx(400 * us)  # 500..900
    assert found.overlap == pytest.approx(150 * us)  # 600..750
    assert found.wall == pytest.approx(900 * us)


def test_on_a_gpu_the_kernels_alone_count() -> None:
    events = [
        op("aten::mm", 0, 1000),
        op("volta_sgemm", 100, 300, tid=7, cat="kernel"),
        op("ncclKernel_AllReduce_RING_LL_Sum_float", 300, 300, tid=8, cat="kernel"),
    ]
    found = overlap_of(events)
    assert found.device == "cuda"
    assert (found.computation, found.communication, found.overlap) == pytest.approx(
        (300e-6, 300e-6, 100e-6)
    )


# ---- the engine alone: a single process, asked from outside as a person at a shell would -----


def test_a_single_process_run_answers_sigusr2_with_a_profile(
    sample_data: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "request.json").write_text(json.dumps({"profile": 4, "steps": 500}))
    env = {**os.environ, "TRAINYARD_DATA_DIR": str(sample_data), "TRAINYARD_NO_DOWNLOAD": "1"}
    command = [
        sys.executable, "-m", "training", "--strategy", "single", "--epochs", "1",
        "--steps-per-epoch", "300", "--log-interval", "5", "--profile-dir", str(folder),
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)  # noqa: S603
    try:
        assert proc.stdout is not None
        events = (json.loads(line) for line in proc.stdout if line.startswith("{"))
        started = next(e for e in events if e["type"] == "started")
        assert started["profile_dir"] == str(folder)
        os.kill(started["requests_pid"], signal.SIGUSR2)
        refused = next(e for e in events if e["type"] == "profile")
        assert refused["state"] == "refused" and "steps" in refused["message"]
        (folder / "request.json").write_text(json.dumps({"profile": 4, "steps": 3}))
        os.kill(started["requests_pid"], signal.SIGUSR2)
        recording = next(e for e in events if e["type"] == "profile")
        ready = next(e for e in events if e["type"] == "profile")
        # A trace that cannot be written (its folder's name taken by a file) is refused with
        # the reason, and the training goes on.
        (folder / "5").write_text("in the way")
        (folder / "request.json").write_text(json.dumps({"profile": 5, "steps": 2}))
        os.kill(started["requests_pid"], signal.SIGUSR2)
        assert next(e for e in events if e["type"] == "profile")["state"] == "recording"
        unwritten = next(e for e in events if e["type"] == "profile")
        assert unwritten["state"] == "refused" and "could not be written" in unwritten["message"]
        assert next(e for e in events if e["type"] == "step")
    finally:
        proc.kill()
        proc.wait()
    assert (recording["state"], ready["state"], ready["recorded_steps"]) == (
        "recording", "ready", 3,
    )  # fmt: skip
    (trace,) = ready["traces"]
    assert trace["path"] == str(folder / "4" / "rank-0.json.gz")
    with gzip.open(trace["path"], "rt") as f:
        steps = {e["name"] for e in json.load(f)["traceEvents"] if "ProfilerStep#" in e["name"]}
    assert len(steps) == 3, steps  # the profiler's own step marks: exactly the steps asked for
    (summary,) = ready["summary"]
    assert summary["communication_seconds"] == 0 and summary["overlap_seconds"] == 0
    assert 0 < summary["computation_seconds"] <= summary["wall_seconds"]
    names = [o["name"] for o in summary["ops"]]
    assert any(n.startswith("aten::") for n in names) and not any(
        "ProfilerStep" in n for n in names
    )


# ---- the run page -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_offers_profile_while_running_and_says_why_not(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    running = experiment_factory(owner=alice, status="running")
    html = logged_in(alice).get(running.get_absolute_url()).content.decode()
    button = html.split('id="profile-button"')[1].split(">")[0]
    assert "disabled" not in button and 'id="profile-steps"' in html and 'value="20"' in html
    assert f'data-request-url="/api/experiments/{running.pk}/profile/"' in html
    ask(logged_in(alice), running)
    html = logged_in(alice).get(running.get_absolute_url()).content.decode()
    assert ">Profiling…</button>" in html and "Requested: 5 step(s)" in html
    queued = experiment_factory(owner=alice)
    html = logged_in(alice).get(queued.get_absolute_url()).content.decode()
    assert "disabled" in html.split('id="profile-button"')[1].split(">")[0]
    done = experiment_factory(owner=alice, status="succeeded")
    html = logged_in(alice).get(done.get_absolute_url()).content.decode()
    assert 'id="profile-button"' not in html and "No profile was recorded." in html
    hogwild = experiment_factory(owner=alice, status="running", strategy="hogwild")
    html = logged_in(alice).get(hogwild.get_absolute_url()).content.decode()
    assert 'id="profile-button"' not in html and "Hogwild cannot record a profile" in html


# ---- the live stack: a 2-rank DDP run -----------------------------------------------------------


@pytest.mark.browser
@pytest.mark.integration
@pytest.mark.sqlite_only  # the stored rows' rules are this file's in-process tests, on both engines
@pytest.mark.timeout(420)
def test_a_profile_of_a_ddp_run_through_the_stack(
    stack: Stack, request: pytest.FixtureRequest
) -> None:
    """As a person does it: the run page's Profile button, its progress live, the summary."""
    from tests.test_integration import launch, socket_open

    tab = request.getfixturevalue("page")  # test_browser's (a parameter would shadow the import)

    alice = stack.login("alice")
    run = launch(alice, stack, name="profiled", strategy="ddp", processes=2, epochs=3)
    api = f"{stack.base_url}/api/experiments/{run['id']}"
    log_in(tab, stack, "alice")
    tab.goto(f"{stack.base_url}/experiments/{run['id']}/")
    with socket_open(stack, alice, run["id"]) as ws:
        # Enabled once the run runs (live, if the page was opened while it was queued); asked
        # while the ranks still start, the request waits for the training's started event.
        tab.wait_for_function(ENABLED, timeout=120_000)
        tab.fill("#profile-steps", "3")
        tab.click("#profile-button")
        tab.wait_for_function(f"() => {BUTTON}.textContent === 'Profiling…' && {BUTTON}.disabled")
        again = alice.post(f"{api}/profile/", json={"steps": 3}, timeout=10)
        assert again.status_code == 409 and "already" in again.json()["error"]
        states = _profile_states_until_ready(ws, timeout=240)
    assert states[-2:] == ["recording", "ready"], states
    tab.wait_for_function(READY_SHOWN, timeout=30_000)
    shown = tab.locator("#profile-result")
    assert shown.locator(".profile-rank").count() == 2
    assert shown.locator(".profile-traces a").count() == 2
    assert shown.locator(".profile-ops tbody tr").count() >= 3
    assert "communication" in shown.locator(".profile-rank").first.inner_text()

    ready = alice.get(f"{api}/profiles/latest/", timeout=10).json()["profile"]
    assert ready["state"] == "ready" and ready["recorded_steps"] == 3
    traces = alice.get(f"{api}/profiles/", timeout=10).json()
    assert sorted(t["rank"] for t in traces) == [0, 1]
    for trace in traces:
        download = alice.get(stack.base_url + trace["url"], timeout=30)
        assert download.status_code == 200 and len(download.content) == trace["bytes"]
        events = json.loads(gzip.decompress(download.content))["traceEvents"]
        assert any(e.get("name", "").startswith("c10d::allreduce") for e in events)
    for rank in ready["summary"]:
        self_times = [o["self_cpu_seconds"] for o in rank["ops"]]
        assert 0 < len(self_times) <= 10 and self_times == sorted(self_times, reverse=True)
        assert not any(o["name"].startswith("ProfilerStep") for o in rank["ops"])
        # DDP over Gloo all-reduces every step: some communication, at most all of it hidden.
        # Communication is seen on every rank; how much of it backward hid depends on how the
        # loaded cores interleave Gloo's thread with autograd's, so none hidden is possible.
        assert 0 < rank["communication_seconds"] < rank["wall_seconds"]
        assert 0 <= rank["overlap_seconds"] <= rank["communication_seconds"]
    assert alice.post(f"{api}/stop/", timeout=10).status_code == 202
    wait_for(lambda: stack.experiment_row(run["id"])["status"] == "cancelled", timeout=60,
             what="the cancelled status")  # fmt: skip
    refused = alice.post(f"{api}/profile/", json={"steps": 3}, timeout=10)
    assert refused.status_code == 409 and "cancelled" in refused.json()["error"]
    # The ended run's page keeps the result and takes no more requests.
    tab.wait_for_function("() => document.getElementById('profile-form').hidden")


BUTTON = "document.getElementById('profile-button')"
ENABLED = f"() => !{BUTTON}.disabled"
READY_SHOWN = """() => document.getElementById('profile-state').textContent.startsWith('Ready')
    && document.querySelectorAll('#profile-result .profile-rank').length === 2"""


def _profile_states_until_ready(ws: Any, *, timeout: float) -> list[str]:
    """The `profile` messages' states, as the page gets them, until one says ready."""
    states: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=deadline - time.monotonic()))
        if message["type"] == "profile":
            states.append(message["view"]["state"])
            if states[-1] in ("ready", "failed"):
                return states
        if message["type"] in ("finished", "failed"):
            break
    raise AssertionError(f"no ready profile; states {states}")
