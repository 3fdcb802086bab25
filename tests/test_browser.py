"""A user's path in a real Chromium: log in, start a DDP run, watch it live, look at devices,
checkpoint a run now, stop it; launch DDP, FSDP, pipeline and tensor parallel from the form and
read their accuracy, images/s and each rank's memory side by side on the compare page.

Screenshots land in test-artifacts/ for a person to look at.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dashboard.experiments.core.transitions import FINISHED
from dashboard.experiments.models import option_title
from dashboard.serving import CHROMIUM, CHROMIUM_ARGS
from dashboard.texts import bytes_text
from tests.conftest import need
from tests.docs_screenshots import docs_screenshot
from tests.stack import ROOT, Stack, wait_for
from training.registry import MICROBATCHES, PIPELINE_SCHEDULE, StrategyOption

# sqlite_only: the pages draw what the selectors and the socket give, which tests/test_compare.py,
# test_series.py and the other in-process tests check on PostgreSQL too.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.sqlite_only,
    pytest.mark.timeout(400),
]

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
    # Reduced motion: the running badge's endless pulse (static/css/app.css) has Chromium draw
    # 60 frames a second, 8% of a core while a running run's page is open (measured: 0.7-0.9
    # CPU-s in 10 s, 0.03 with it off), taken from the pass's trainings; readers who ask for
    # reduced motion get the page without it, and so do these.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, reduced_motion="reduce")
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


def start_run(
    page: Any,
    stack: Stack,
    *,
    name: str,
    epochs: int,
    strategy: str = "ddp",
    options: Mapping[StrategyOption, str] | None = None,
    batch_size: int | None = None,
) -> int:
    """Launch from the form, as a person does; the new run's id, from the page it lands on."""
    page.goto(f"{stack.base_url}/experiments/new/")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Strategy").select_option(strategy)
    # The Processes and Batch size lines follow the strategy, in the server's words (#form-help);
    # a pipeline's says its model's stage limit before the form is sent (issue 34 item 10).
    lines = page.evaluate(
        "s => JSON.parse(document.getElementById('form-help').textContent).strategies[s]", strategy
    )
    assert page.locator("#id_batch_size_helptext").inner_text() == lines["batch_size"]
    processes_line = page.locator("#id_processes_helptext").inner_text()
    assert processes_line.startswith(lines["processes"])
    if lines["stages"]:
        assert "simple-cnn splits into at most 2 stages" in processes_line
    page.get_by_label("Processes").fill("2")
    page.get_by_label("Epochs").fill(str(epochs))
    if batch_size is not None:
        page.get_by_label("Batch size").fill(str(batch_size))
    for option, value in (options or {}).items():
        option_fill(page.get_by_label(option_title(option), exact=True), value)
    page.get_by_role("button", name="Start").click()
    page.wait_for_url("**/experiments/*/")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def option_fill(field: Any, value: str) -> None:
    """A strategy option's field: a select of the registry's choices, or a number."""
    if field.evaluate("node => node.tagName") == "SELECT":
        field.select_option(value)
    else:
        field.fill(value)


@pytest.mark.docs_screenshots
def test_start_ddp_and_watch_it_live(page: Any, stack: Stack) -> None:
    log_in(page, stack, "alice")
    start_run(page, stack, name="browser ddp", epochs=2)
    # The Rank filter gains each rank as it first logs (issue 34 item 7): opened at launch, the
    # page had none to offer; rank 1's first line comes live, with no reload.
    offered = "() => Array.from(document.querySelectorAll('#log-rank option'), o => o.value)"
    assert "1" not in page.evaluate(offered)
    page.wait_for_function(f"() => ({offered})().includes('1')", timeout=120_000)
    assert page.evaluate(f"() => ({offered})().indexOf('1') > 0")  # after "every rank"
    # Points arrive over the WebSocket, without a reload.
    page.wait_for_function(f"() => ({CHART_POINTS})().some(n => n >= 3)", timeout=120_000)
    screenshot(page, "live-chart.png")
    docs_screenshot(page, "run-live")
    docs_screenshot(page, "run-charts", at="#section-training")
    page.wait_for_function(STATUS_IS % "succeeded", timeout=180_000)
    points_live = page.evaluate(CHART_POINTS)
    # The headline's throughput is the run's so far (issue 34 item 2): the same after a reload,
    # where it once read the last, short, window's.
    ips_live = page.locator("#stat-ips").inner_text()
    # Filled in live, also where the page was opened before the run started.
    assert page.locator("#info-worker").inner_text() == "test-worker"
    assert "—" not in page.locator("#stat-duration").inner_text()
    assert "—" not in page.locator("#info-started").inner_text()
    # A short curve is drawn with dots (a point alone would otherwise draw nothing).
    assert page.evaluate(TRAIN_DOTTED) is True
    page.reload()
    page.wait_for_function(f"() => ({CHART_POINTS})().some(n => n > 0)", timeout=30_000)
    assert page.evaluate(CHART_POINTS) == points_live  # a reload draws the same curve
    assert page.locator("#stat-ips").inner_text() == ips_live != "—"
    screenshot(page, "finished-run.png")
    page.goto(f"{stack.base_url}/")
    row = page.get_by_role("row", name="browser ddp")
    assert "succeeded" in row.inner_text().lower()


@pytest.mark.docs_screenshots
def test_device_page_shows_the_worker(page: Any, stack: Stack) -> None:
    log_in(page, stack, "alice")
    page.goto(f"{stack.base_url}/devices/")
    body = page.locator("body")
    body.get_by_text("test-worker").first.wait_for()
    text = body.inner_text()
    assert "no GPU" in text and "gloo" in text.lower() and "/dev/shm" in text
    # Issue 34 item 14: who holds the machine now, how busy it is, GPUs in words, no probe.
    assert "Held now" in text and "CPU busy" in text and "% of all cores" in text
    assert "NVML Shared Library" not in text and "probe" not in text
    screenshot(page, "devices.png")
    docs_screenshot(page, "devices")


@pytest.mark.docs_screenshots
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
    docs_screenshot(page, "run-stopped")


# Issue 18's four ways of spreading one model over 2 processes, each launched from the form; the
# pipeline's with its own fields (a schedule off its default; fewer micro-batches, fewer sends).
FOUR = {
    "ddp": {},
    "fsdp": {},
    "pipeline": {PIPELINE_SCHEDULE: "1f1b", MICROBATCHES: "2"},
    "tensor-parallel": {},
}
# Four times the form's 64: the same epoch of the sample in a quarter of the steps, each a
# gather, a scatter or a send between the ranks; the shares compared below are of parameters.
FOUR_BATCH = 256
PERCENT = re.compile(r"([0-9.]+)%")


def runs_ended(stack: Stack, ids: list[int]) -> list[dict[str, Any]]:
    """The runs' read JSON once every one has ended (they queue one after another: each takes
    both cores)."""
    session = stack.login("alice")

    def read() -> list[dict[str, Any]]:
        runs = [session.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=30).json()
                for pk in ids]  # fmt: skip
        # Empty, so wait_for waits on, until every run has finished (a lost one resumes).
        return runs if all(r["status"] in FINISHED for r in runs) else []

    try:
        found: list[dict[str, Any]] = wait_for(read, timeout=300, what="four runs", interval=2)
    except TimeoutError:
        raise AssertionError(stack.diagnostics()) from None
    return found


def throughput_by_hand(stack: Stack, pk: int) -> float:
    """By hand from the stored step points, what the compare page's throughput means: the
    images over the windows' time (metrics/throughput.py), each window the steps since the last."""
    points = stack.query(
        "SELECT step, value FROM experiments_seriespoint WHERE experiment_id = ? AND "
        "key = 'images_per_second' ORDER BY step, id",
        pk,
    )
    steps, batches, last = 0, 0.0, 0
    for step, value in points:
        if step > last and value:
            steps, batches = steps + step - last, batches + (step - last) / value
        last = max(last, step)
    return steps / batches


def shown_ranks(row: Any) -> dict[int, str]:
    """Each rank's line of a compare row's memory cell, opened as a person opens it."""
    row.locator('[data-field="memory"] summary').click()
    lines = row.locator('[data-field="memory"] li[data-rank]')
    return {
        int(lines.nth(i).get_attribute("data-rank")): lines.nth(i).inner_text()
        for i in range(lines.count())
    }


def shares_check(row: Any, memory: list[dict[str, int]], whole: int) -> list[float]:
    """The page's line per rank says what the read JSON's memory says: the bytes the rank holds
    and its parameters' share of one whole copy of the model. The shares, from the page."""
    lines = shown_ranks(row)
    assert sorted(lines) == [entry["rank"] for entry in memory]
    shares = []
    for entry in memory:
        line = lines[entry["rank"]]
        held = entry["parameter_bytes"] + entry["gradient_bytes"] + entry["optimizer_state_bytes"]
        assert bytes_text(held) in line
        shown = float(PERCENT.findall(line)[0])
        assert shown == pytest.approx(100 * entry["parameter_bytes"] / whole, abs=0.5)
        shares.append(shown)
    return shares


def test_four_strategies_from_the_form_side_by_side_on_compare(page: Any, stack: Stack) -> None:
    log_in(page, stack, "alice")
    ids = {
        strategy: start_run(page, stack, name=f"walk {strategy}", epochs=1, strategy=strategy,
                            options=options, batch_size=FOUR_BATCH)
        for strategy, options in FOUR.items()
    }  # fmt: skip
    runs = dict(zip(ids, runs_ended(stack, list(ids.values())), strict=True))
    assert {name: run["status"] for name, run in runs.items()} == dict.fromkeys(ids, "succeeded")
    # The same model and data, every option the form set read back.
    assert len({(run["model"], run["dataset"], run["batch_size"]) for run in runs.values()}) == 1
    assert runs["ddp"]["batch_size"] == FOUR_BATCH
    pipeline_options = {option.name: runs["pipeline"][option.name] for option in FOUR["pipeline"]}
    assert pipeline_options == {"pipeline_schedule": "1f1b", "microbatches": 2}

    page.goto(f"{stack.base_url}/experiments/compare/?ids={','.join(map(str, ids.values()))}")
    # DDP holds one whole copy of the model on every rank: the yardstick of the others' shares.
    whole = runs["ddp"]["memory"][0]["parameter_bytes"]
    shares = {}
    for strategy, pk in ids.items():
        row, run = page.locator(f'#compare-table tr[data-id="{pk}"]'), runs[strategy]
        accuracy = float(PERCENT.findall(row.locator('[data-field="accuracy"]').inner_text())[0])
        assert accuracy == pytest.approx(100 * run["test_accuracy"], abs=0.005)
        throughput = row.locator('[data-field="throughput"]').inner_text()
        shown_ips = float(throughput.split()[0].replace(",", ""))
        assert shown_ips == pytest.approx(throughput_by_hand(stack, pk), abs=0.5)
        shares[strategy] = shares_check(row, run["memory"], whole)
    assert shares["ddp"] == [100.0, 100.0]
    # FSDP and tensor parallel hold less on each rank than DDP does; the pipeline's two ranks
    # hold different parts, which together make the model.
    assert max(shares["fsdp"]) < 100 and max(shares["tensor-parallel"]) < 100
    stages = [entry["parameter_bytes"] for entry in runs["pipeline"]["memory"]]
    assert stages[0] != stages[1] and sum(stages) == whole
    page.evaluate("() => window.scrollTo(0, 0)")  # the opened rows scrolled it: start at the top
    screenshot(page, "compare-strategies.png")


# The stylesheet's endless animations, as a reader who asks for reduced motion gets them.
MOTION = """() => {
  const badge = document.querySelector('.badge.status-running');
  const dots = [...document.querySelectorAll('.conn-dot')];
  return [getComputedStyle(badge, '::before').animationName,
          ...dots.map(dot => getComputedStyle(dot).animationName)];
}"""


def test_the_endless_animations_stop_for_reduced_motion(browser: Any, stack: Stack) -> None:
    html = (
        f'<link rel="stylesheet" href="{stack.base_url}/static/css/app.css">'
        '<span class="badge status-running">running</span>'
        '<span class="conn" data-state="connecting"><span class="conn-dot"></span></span>'
        '<span class="conn" data-state="reconnecting"><span class="conn-dot"></span></span>'
    )
    seen = {}
    for motion in ("no-preference", "reduce"):
        context = browser.new_context(reduced_motion=motion)
        try:
            page = context.new_page()
            page.set_content(html, wait_until="load")
            seen[motion] = page.evaluate(MOTION)
        finally:
            context.close()
    assert seen == {"no-preference": ["pulse"] * 3, "reduce": ["none"] * 3}
