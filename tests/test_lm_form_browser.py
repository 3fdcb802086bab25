"""The launch form's language-model fields in a real Chromium (Django's live server, no stack):
they are hidden for a classifier and must then play no part in the form. A hidden field that
keeps an invalid value (a window typed for byte-llama, then the model switched) would stop the
form in the browser, which refuses to send a form with an invalid field it cannot show ("not
focusable"), and the user would see nothing happen; the server drops the fields for a
classifier anyway (core/language_fields.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Experiment
from tests.docs_screenshots import docs_screenshot
from tests.live_browser import live_page
from tests.test_lm_dashboard import lm_report

# sqlite_only: the form's catalogue comes from the workers' reports, read alike on either engine.
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.sqlite_only]


@pytest.fixture
def page(live_server: Any, user_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Alice's page, a worker with the Jargon File and a text folder online."""
    WorkerMachine.objects.create(hostname="host-a", report=lm_report(), reported_at=timezone.now())
    with live_page(live_server, user_factory(username="alice"), monkeypatch) as opened:
        yield opened


@pytest.mark.docs_screenshots
def test_a_hidden_window_left_invalid_does_not_stop_a_classifiers_launch(
    page: Any, live_server: Any, launched: list[int]
) -> None:
    page.goto(f"{live_server.url}/experiments/new/")
    fields = page.locator("#language-fields")
    page.select_option("select[name=model]", "byte-llama")
    page.select_option("select[name=dataset]", "jargon")
    assert fields.is_visible()
    docs_screenshot(page, "lm-form", at="#language-fields")
    page.fill("input[name=seq_len]", "4")  # under the window's least (8): invalid
    window = page.locator("input[name=seq_len]")
    page.select_option("select[name=model]", "simple-cnn")
    assert fields.is_hidden() and window.is_disabled()
    # Back to byte-llama and away again: the value typed stays for a switch back.
    page.select_option("select[name=model]", "byte-llama")
    assert window.is_enabled() and window.input_value() == "4"
    page.select_option("select[name=model]", "simple-cnn")
    page.select_option("select[name=dataset]", "mnist")
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url(re.compile(r"/experiments/\d+/$"), timeout=15_000)
    run = Experiment.objects.get()
    assert (run.model, run.dataset, run.model_size, run.seq_len) == (
        "simple-cnn", "mnist", "", None,
    )  # fmt: skip
    assert launched == [run.pk]
