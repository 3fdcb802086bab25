"""The stalled banner's "Stop and resume from the last checkpoint" in real Chromium against
Django's live server (tests/live_browser.py: no stack; the page's messages are dispatched as its
socket would): the button posts the attempt the page shows, stays disabled once asked, and a
later attempt's stall in the same page left open offers it again (static/js/stalled.js)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dashboard.experiments.models import Experiment
from tests.live_browser import live_page
from tests.test_stall_resume import STALLED, runs_dir, stalled_run  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def message(page: Any, body: dict[str, Any]) -> None:
    """What the run's socket hands the page (static/js/common.js's run:message)."""
    page.evaluate(
        "(msg) => document.getElementById('experiment-detail')"
        ".dispatchEvent(new CustomEvent('run:message', { detail: msg }))",
        body,
    )


def test_a_later_attempts_stall_offers_stop_and_resume_again_in_a_page_left_open(
    live_server: Any,
    user_factory: Any,
    experiment_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alice = user_factory(username="alice")
    run = stalled_run(experiment_factory, alice, worker="w1")
    with live_page(live_server, alice, monkeypatch) as page:
        page.goto(f"{live_server.url}/experiments/{run.pk}/")
        button = page.locator("#stalled-resume")
        assert button.is_enabled()
        with page.expect_response(lambda r: r.url.endswith("/resume/")) as answer:
            button.click()
        assert answer.value.status == 202, answer.value.text()
        assert json.loads(answer.value.request.post_data) == {"attempt": 1}
        assert Experiment.objects.get(pk=run.pk).resume_requested
        page.wait_for_function("() => document.getElementById('stalled-resume').disabled")
        # Attempt 1 ends and the run is queued again; attempt 2 runs, then stalls too.
        message(page, {"type": "status", "status": "queued", "reason": "attempt 1 stopped"})
        message(page, {"type": "status", "status": "running", "attempt": 2, "worker": "w1",
                       "started_at": "2026-12-06T10:00:00+00:00"})  # fmt: skip
        offer = "ends every process and starts attempt 3 from the last checkpoint (step 64)."
        message(page, {"type": "stalled", "stalled": STALLED, "text": STALLED["text"],
                       "level": "warning", "texts": {"since": "stalled since 10:02:02 UTC",
                       "ranks": [], "resume": {"resumable": True, "text": offer}}})  # fmt: skip
        assert page.locator("#stalled-resume-text").inner_text() == offer
        assert button.is_enabled()
        with page.expect_request(lambda r: r.url.endswith("/resume/")) as asked:
            button.click()
        assert json.loads(asked.value.post_data) == {"attempt": 2}
