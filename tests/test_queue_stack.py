"""The queue on the real stack: a Celery worker claiming real runs, Redis, daphne and Chromium.

The worker is restarted with the environment each test needs (how many runs its machine holds
at once, the per-user running limit) and put back as it was afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psutil
import pytest

from tests.stack import Stack, wait_for
from tests.test_browser import browser, log_in, screenshot  # noqa: F401 (browser: a fixture)

# sqlite_only: the order and limits of claims are tests/test_queue.py's, on both engines, and
# claims racing across workers are tests/test_placement_workers.py's and the survival tests', on
# PostgreSQL; here one worker claims them as make run's does, on its embedded default.
pytestmark = [pytest.mark.integration, pytest.mark.sqlite_only, pytest.mark.timeout(900)]

# Loaded machine: every run here is one short epoch, but six engineers share two cores.
RUN_TIMEOUT = 420


def worker_restart(stack: Stack, env: dict[str, str]) -> None:
    old = stack.services["worker"]
    old.stop()
    # The new worker writes worker.log afresh: keep what the old one wrote, for diagnostics.
    if old.log_path.exists():
        old.log_path.rename(old.log_path.with_name(f"worker-{time.time():.0f}.log"))
    for name, value in env.items():
        if value:
            stack.env[name] = value
        else:
            stack.env.pop(name, None)
    stack.worker_start()


@pytest.fixture
def worker_env(stack: Stack) -> Iterator[Any]:
    """Call it with the worker's environment for this test; the old one comes back after."""
    names = ("TRAINYARD_CPU_THREADS_PER_RUN", "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER")
    before = {name: stack.env.get(name, "") for name in names}
    root = stack.login("root")
    # Runs left by other tests would take places in the queue this test counts.
    wait_for(lambda: not active(stack, root), timeout=RUN_TIMEOUT, what="an idle stack", interval=1)
    yield lambda **env: worker_restart(stack, env)
    worker_restart(stack, before)


def active(stack: Stack, session: Any) -> list[dict[str, Any]]:
    runs = session.get(f"{stack.base_url}/api/experiments/?status=queued", timeout=10).json()
    running = session.get(f"{stack.base_url}/api/experiments/?status=running", timeout=10).json()
    return [*runs["experiments"], *running["experiments"]]


def launch(session: Any, stack: Stack, name: str, *, epochs: int = 1) -> int:
    fields = {"name": name, "strategy": "single", "epochs": epochs, "batch_size": 128}
    response = session.post(f"{stack.base_url}/api/experiments/", json=fields, timeout=10)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def run(stack: Stack, session: Any, pk: int) -> dict[str, Any]:
    response = session.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_ended(stack: Stack, session: Any, ids: list[int]) -> list[dict[str, Any]]:
    """The runs once every one has ended; on a timeout, where each stood and the logs."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while True:
        runs = [run(stack, session, pk) for pk in ids]
        if all(r["status"] not in ("queued", "running") for r in runs):
            return runs
        if time.monotonic() > deadline:
            states = [(r["id"], r["status"], r["waiting_reason"], r["step"]) for r in runs]
            raise AssertionError(f"not ended in {RUN_TIMEOUT} s: {states}\n{stack.diagnostics()}")
        time.sleep(1)


def wait_running(stack: Stack, session: Any, pk: int) -> None:
    wait_for(
        lambda: run(stack, session, pk)["status"] == "running",
        timeout=120,
        what=f"#{pk} to start",
        interval=0.5,
    )


def queue(stack: Stack, session: Any) -> dict[str, Any]:
    response = session.get(f"{stack.base_url}/api/queue/", timeout=20)
    assert response.status_code == 200, response.text
    return dict(response.json())


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def assert_one_after_another(runs: list[dict[str, Any]]) -> None:
    """Started in this order, each once the one before had ended: none overtook."""
    for earlier, later in zip(runs, runs[1:], strict=False):
        assert at(later["started_at"]) >= at(earlier["finished_at"]), (earlier, later)


def test_claims_are_first_in_first_out_within_priority(
    stack: Stack,
    worker_env: Any,
    browser: Any,  # noqa: F811
) -> None:
    # Each run takes every core of the worker's machine: one at a time.
    worker_env(TRAINYARD_CPU_THREADS_PER_RUN="1000", TRAINYARD_MAX_ACTIVE_RUNS_PER_USER="")
    alice, bob, root = stack.login("alice"), stack.login("bob"), stack.login("root")
    # Stopped once the pages below are seen, which frees the cores; paused while they are
    # looked at, so 5 epochs outlast them. A tenth of it (the estimate's wait below) is half an
    # epoch: 30 epochs made that wait 3 epochs, 40 s of the test.
    blocker = launch(bob, stack, "blocker", epochs=5)
    wait_running(stack, bob, blocker)
    # Three behind the blocker: the head, and two whose order and reasons say first in first out.
    a, b = (launch(alice, stack, f"fifo {n}") for n in "ab")
    urgent = launch(alice, stack, "urgent")
    answer = root.post(f"{stack.base_url}/api/queue/{urgent}/priority/", json={"priority": 5})
    assert answer.status_code == 200, answer.text

    def settled() -> dict[str, Any] | None:
        # Every message tried since the priority moved: each says what it waits for now.
        listing = queue(stack, root)
        entries = listing["queue"]
        if [e["id"] for e in entries] != [urgent, a, b]:
            return None
        if f"#{blocker}" not in entries[0]["reason"]:  # the cores the blocker holds
            return None
        behind = f"waiting behind #{urgent}"
        return listing if all(e["reason"].startswith(behind) for e in entries[1:]) else None

    listing = wait_for(settled, timeout=90, what="the queue's order and reasons", interval=0.5)
    assert [e["position"] for e in listing["queue"]] == [1, 2, 3]
    assert listing["queue"][2]["reason"].endswith("3rd in the queue")

    # Once the blocker is a tenth of the way through, the head's start is expected from its pace
    # (before that its time is mostly start-up: issue 34 item 11).
    def tenth() -> bool:
        blocking = run(stack, bob, blocker)
        return bool(blocking["total_steps"]) and blocking["step"] * 10 >= blocking["total_steps"]

    wait_for(tenth, timeout=180, what="a tenth of the steps", interval=0.5)
    with paused(stack, blocker):
        # Waiting runs are parked, not polled (issue 35 item 2): no claim of the two behind the
        # head meanwhile (each claim writes the run's heartbeat_at; main retried every second).
        claimed_at = claims_last(stack, [a, b])
        time.sleep(3)
        assert claims_last(stack, [a, b]) == claimed_at
        head = queue(stack, root)["queue"][0]
        assert head["id"] == urgent and head["estimated_start_seconds"] > 0, head
        assert head["estimated_start_text"].startswith("in about "), head
        queue_pages_check(stack, browser, ids=[urgent, a, b])
    assert bob.post(f"{stack.base_url}/api/experiments/{blocker}/stop/").status_code == 202
    runs = wait_ended(stack, root, [blocker, urgent, a, b])
    statuses = [r["status"] for r in runs]
    assert statuses == ["cancelled"] + ["succeeded"] * 3, stack.diagnostics()
    assert_one_after_another(runs)


def claims_last(stack: Stack, ids: list[int]) -> list[Any]:
    """When each run's last claim was (a claim that finds no room writes heartbeat_at)."""
    return [
        stack.query("SELECT heartbeat_at FROM experiments_experiment WHERE id = ?", pk)[0][0]
        for pk in ids
    ]


@contextlib.contextmanager
def paused(stack: Stack, pk: int) -> Iterator[None]:
    """The run's processes stopped (SIGSTOP) meanwhile, then continued: still running and
    holding its cores for the queue (its heartbeats are its supervisor's), without spending the
    minute of CPU the pages' checks take, which the other tests of a loaded pass need."""
    launcher = psutil.Process(stack.experiment_row(pk)["launcher_pid"])
    family = [launcher, *launcher.children(recursive=True)]
    try:
        for process in family:
            process.suspend()
        yield
    finally:
        for process in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()


def queue_pages_check(stack: Stack, browser: Any, *, ids: list[int]) -> None:  # noqa: F811
    """The page as Alice (her runs, positions, reasons, Cancel), Bob (nothing of hers) and
    staff (a priority control)."""
    context = browser.new_context(  # reduced motion: tests/test_browser.py's page
        viewport={"width": 1280, "height": 900}, reduced_motion="reduce"
    )
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        log_in(page, stack, "alice")
        # From a queued run's page, whose waiting box links to the queue.
        page.goto(f"{stack.base_url}/experiments/{ids[1]}/")
        page.get_by_role("link", name="See its place in the queue").click()
        page.wait_for_url(f"{stack.base_url}/queue/")
        rows = page.locator("#queue-rows tr")
        assert [int(r) for r in rows.evaluate_all("rs => rs.map(r => r.dataset.id)")] == ids
        positions = page.locator("#queue-rows [data-field=position]").all_inner_texts()
        assert [p.split()[0] for p in positions] == ["1", "2", "3"]
        reasons = page.locator("#queue-rows [data-field=reason]").all_inner_texts()
        assert reasons[1].startswith(f"waiting behind #{ids[0]}")
        # Each estimate says what it rests on (issue 34 item 11): a run's end and how it was
        # expected, free devices, or why there is none.
        bases = page.locator("#queue-rows [data-field=estimate-basis]").all_inner_texts()
        assert len(bases) == 3 and all(
            b.startswith(
                ("when #", "when another user's run", "its devices are free", "no estimate")
            )
            for b in bases
        ), bases
        assert page.locator(".priority-input").count() == 0  # not staff
        screenshot(page, "queue-alice.png")
        # Cancel a run of hers that waits: it leaves the queue, the others move up.
        extra = launch(stack.login("alice"), stack, "to cancel")
        page.wait_for_selector(f"#queue-rows tr[data-id='{extra}']", timeout=20_000)
        page.locator(f"#queue-rows tr[data-id='{extra}'] .queue-cancel").click()
        # The page hears of the cancel and redraws; on two loaded cores that took over 30 s once.
        page.wait_for_selector(
            f"#queue-rows tr[data-id='{extra}']", state="detached", timeout=60_000
        )
        assert run(stack, stack.login("alice"), extra)["status"] == "cancelled"
        context.clear_cookies()
        log_in(page, stack, "bob")
        page.get_by_role("link", name="Queue", exact=True).click()
        page.wait_for_url(f"{stack.base_url}/queue/")
        assert page.locator("#queue-rows tr").count() == 0
        assert page.locator("#queue-empty").is_visible()
        assert (
            "3 runs queued in all; 0 of them yours" in page.locator("#queue-summary").inner_text()
        )
        assert "fifo" not in page.content() and "alice" not in page.content()
        screenshot(page, "queue-bob.png")
        context.clear_cookies()
        log_in(page, stack, "root")
        page.goto(f"{stack.base_url}/queue/")
        assert page.locator(".priority-input").count() == len(ids)
        screenshot(page, "queue-staff.png")
    finally:
        context.close()
    assert not errors, f"script errors in the page: {errors}"


def test_the_running_limit_holds_at_claim_time(stack: Stack, worker_env: Any) -> None:
    # Two runs fit on the machine at once, but one user may hold only one running.
    worker_env(TRAINYARD_CPU_THREADS_PER_RUN="1", TRAINYARD_MAX_ACTIVE_RUNS_PER_USER="1")
    alice, bob, root = stack.login("alice"), stack.login("bob"), stack.login("root")
    first = launch(alice, stack, "limit 1", epochs=2)
    wait_running(stack, alice, first)
    second = launch(alice, stack, "limit 2")
    waiting = wait_for(
        lambda: (
            "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER"
            in (r := run(stack, alice, second))["waiting_reason"]
            and r
        ),
        timeout=120,
        what="the second run to wait for the limit",
        interval=0.5,
    )
    assert waiting["waiting_reason"].startswith("waiting for one of its owner's runs to end")
    # Launched after Alice's second; the second pool slot is free while hers waits.
    bobs = launch(bob, stack, "bob's, launched after")
    runs = wait_ended(stack, root, [first, second, bobs])
    assert [r["status"] for r in runs] == ["succeeded"] * 3, stack.diagnostics()
    by_id = {r["id"]: r for r in runs}
    assert_one_after_another([by_id[first], by_id[second]])
    # Bob's run was not held up behind Alice's waiting one: it ran beside her first.
    assert at(by_id[bobs]["started_at"]) < at(by_id[first]["finished_at"])
