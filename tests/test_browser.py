"""A user's path in a real Chromium: log in, start a DDP run, watch it live, look at devices,
checkpoint a run now, stop it.

Screenshots land in test-artifacts/ for a person to look at.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.serving import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import need
from tests.stack import ROOT, Stack

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(400)]

ARTIFACTS = ROOT / "test-artifacts"

STATUS_IS = """() => document.getElementById('status-badge').textContent.trim().toLowerCase()
    === '%s'"""
# Buckets held by the loss, accuracy and learning-rate charts (static/js/charts.js): one per
# point while a run is shorter than the server's bucket budget, live points appended as one-point
# buckets.
CHART_POINTS = """() => ['train_loss', 'test_loss', 'test_accuracy', 'lr'].map(id =>
    [...(TrainyardCharts.instances.get(id)?.lines.values() || [])]
        .reduce((n, l) => n + l.buckets.length, 0))"""

TRAIN_DOTTED = (
    """() => TrainyardCharts.instances.get('train_loss').drawn().lines['Training loss'].dotted"""
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    need(Path(CHROMIUM).exists() or shutil.which("chromium") is not None, "no Chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, stack: Stack) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"script errors in the page: {errors}"


def log_in(page: Any, stack: Stack, username: str) -> None:
    page.goto(f"{stack.base_url}/")
    assert "/accounts/login/" in page.url  # every page needs login
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(stack.passwords[username])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{stack.base_url}/")


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def start_run(page: Any, stack: Stack, *, name: str, epochs: int) -> None:
    page.goto(f"{stack.base_url}/experiments/new/")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Strategy").select_option("ddp")
    page.get_by_label("Processes").fill("2")
    page.get_by_label("Epochs").fill(str(epochs))
    page.get_by_role("button", name="Start").click()
    page.wait_for_url("**/experiments/*/")


def test_start_ddp_and_watch_it_live(page: Any, stack: Stack) -> None:
    log_in(page, stack, "alice")
    start_run(page, stack, name="browser ddp", epochs=2)
    # Points arrive over the WebSocket, without a reload.
    page.wait_for_function(f"() => ({CHART_POINTS})().some(n => n >= 3)", timeout=120_000)
    screenshot(page, "live-chart.png")
    page.wait_for_function(STATUS_IS % "succeeded", timeout=180_000)
    points_live = page.evaluate(CHART_POINTS)
    # Filled in live, also where the page was opened before the run started.
    assert page.locator("#info-worker").inner_text() == "test-worker"
    assert "—" not in page.locator("#stat-duration").inner_text()
    assert "—" not in page.locator("#info-started").inner_text()
    # A short curve is drawn with dots (a point alone would otherwise draw nothing).
    assert page.evaluate(TRAIN_DOTTED) is True
    page.reload()
    page.wait_for_function(f"() => ({CHART_POINTS})().some(n => n > 0)", timeout=30_000)
    assert page.evaluate(CHART_POINTS) == points_live  # a reload draws the same curve
    screenshot(page, "finished-run.png")
    page.goto(f"{stack.base_url}/")
    row = page.get_by_role("row", name="browser ddp")
    assert "succeeded" in row.inner_text().lower()


def test_device_page_shows_the_worker(page: Any, stack: Stack) -> None:
    log_in(page, stack, "alice")
    page.goto(f"{stack.base_url}/devices/")
    body = page.locator("body")
    body.get_by_text("test-worker").first.wait_for()
    text = body.inner_text()
    assert "no GPU" in text and "gloo" in text.lower() and "/dev/shm" in text
    screenshot(page, "devices.png")


def test_checkpoint_then_stop_a_run_from_its_page(page: Any, stack: Stack) -> None:
    log_in(page, stack, "bob")
    start_run(page, stack, name="browser stop", epochs=30)
    page.wait_for_function(f"() => ({CHART_POINTS})().some(n => n >= 1)", timeout=120_000)

    button = page.locator("#checkpoint-button")
    assert button.is_enabled() and button.inner_text() == "Checkpoint now"
    button.click()
    # Live: the row appears and the button is ready again, without a reload.
    row = page.locator("#checkpoints-body tr", has_text="on request, mid-epoch")
    row.wait_for(timeout=60_000)
    assert "Saved at step" in page.locator("#checkpoint-status").inner_text()
    assert button.is_enabled() and row.get_by_role("link", name="Download").count() == 1
    screenshot(page, "checkpoint-now.png")

    page.get_by_role("button", name="Stop").click()
    page.wait_for_function(STATUS_IS % "cancelled", timeout=30_000)
    assert (
        page.get_by_role("button", name="Stop").count() == 0
        or not page.get_by_role("button", name="Stop").is_enabled()
    )
    assert not button.is_visible()  # nothing left to checkpoint
    screenshot(page, "stopped-run.png")
