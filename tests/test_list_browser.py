"""The run list and the run page's log panel in real Chromium, against Django's live server
(no socket needed: the list polls, the log panel reads the logs API): more runs by keyset,
filters, sorting, an idle poll answered 304, rank 1's lines filtered, tags and note saved."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.experiments.models import Experiment, LogLine, Status
from tests.live_browser import live_page
from tests.stack import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture
def page(live_server: Any, user_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    alice = user_factory(username="alice")
    # Reduced motion: tests/test_browser.py's page.
    context = {"viewport": {"width": 1366, "height": 900}, "reduced_motion": "reduce"}
    with live_page(live_server, alice, monkeypatch, **context) as page:
        page.alice = alice
        yield page


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_the_list_pages_filters_sorts_and_polls_for_free(
    page: Any, live_server: Any, experiment_factory: Any
) -> None:
    for i in range(60):
        experiment_factory(
            owner=page.alice,
            name=f"sweep {i:02d}",
            status=Status.SUCCEEDED if i % 2 else Status.FAILED,
            test_accuracy=0.9 + i / 1000,
            tags=["baseline"] if i % 10 == 0 else [],
        )
    responses: list[int] = []
    page.on(
        "response", lambda r: responses.append(r.status) if "/api/experiments/?" in r.url else None
    )
    page.goto(f"{live_server.url}/")
    rows = page.locator("#experiment-rows tr")
    assert rows.count() == 50 and page.locator("#list-count").inner_text() == "60 runs"
    page.get_by_role("button", name="More runs").click()
    page.wait_for_function("() => document.querySelectorAll('#experiment-rows tr').length === 60")
    assert page.locator("#list-more").is_hidden()
    # Two polls of an unchanged list: the second is a bodiless 304.
    page.wait_for_timeout(4500)
    assert 304 in responses, responses
    ids = [int(i) for i in rows.evaluate_all("rows => rows.map(r => r.dataset.id)")]
    assert len(set(ids)) == 60
    screenshot(page, "list-more.png")

    page.get_by_label("Tag").fill("baseline")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**tag=baseline**")
    assert rows.count() == 6 and page.locator("#list-count").inner_text() == "6 runs"
    page.get_by_role("link", name="Test accuracy").click()
    page.wait_for_url("**sort=-accuracy**")
    names = rows.locator('[data-field="name"]').all_inner_texts()
    assert names == [f"sweep {i:02d}" for i in (50, 40, 30, 20, 10, 0)]
    assert page.locator("tr.row-new").count() == 0
    screenshot(page, "list-filtered.png")


def test_the_log_panel_filters_rank_1_and_the_labels_save(
    page: Any, live_server: Any, experiment_factory: Any
) -> None:
    run: Experiment = experiment_factory(owner=page.alice, name="ddp two ranks")
    lines = []
    for seq in range(1, 1201):
        rank = seq % 2
        level = "warning" if seq % 100 == 0 else "info"
        lines.append(
            LogLine(
                experiment=run,
                seq=seq,
                time=seq / 10,
                rank=rank,
                level=level,
                message=f"line {seq} of rank {rank}",
            )  # fmt: skip
        )
    LogLine.objects.bulk_create(lines)
    page.goto(f"{live_server.url}/experiments/{run.pk}/")
    page.wait_for_function("() => document.querySelectorAll('#log-rank option').length === 3")
    # Both log panels draw a line with common.js: no time for plain output (0), no rank for the
    # dashboard's own lines, rank 0 shown.
    drawn = page.evaluate(
        """() => [{ seq: 1, time: 0, rank: null, level: "info", message: "plain" },
                  { seq: 2, time: 2.5, rank: 0, level: "warning", message: "w" }].map((l) => {
          const li = Trainyard.logLine(l);
          return [li.className, ...[...li.children].map((c) => c.textContent)];
        })"""
    )
    assert drawn == [["log-info", "", "", "plain"], ["log-warning", "2.5s", "r0", "w"]]
    # Both run sockets (run page, compare) read in order with common.js: after the snapshot an
    # event had already is dropped, a gap closes the socket for a fresh snapshot.
    read = page.evaluate(
        """() => {
          const got = [], ws = { close: (code) => got.push("close " + code) };
          const read = Trainyard.runSocketReader(ws, {
            onSnapshot: (m) => got.push("snapshot " + m.seq),
            onEvent: (m) => got.push("event " + m.seq),
          });
          for (const m of [{ type: "snapshot", seq: 5 }, { type: "log", seq: 5 },
                           { type: "log", seq: 6 }, { type: "log", seq: 8 }]) {
            read({ data: JSON.stringify(m) });
          }
          read({ data: "not json" });
          return got;
        }"""
    )
    assert read == ["snapshot 5", "event 6", "close 4000"]
    page.select_option("#log-rank", "1")
    pages = page.locator("#log-pages li")
    page.wait_for_function("() => document.querySelectorAll('#log-pages li').length === 500")
    assert set(pages.locator(".log-rank").all_inner_texts()) == {"r1"}
    assert pages.first.locator(".log-msg").inner_text() == "line 1 of rank 1"
    page.get_by_role("button", name="More lines").click()
    page.wait_for_function("() => document.querySelectorAll('#log-pages li').length === 600")
    assert page.locator("#log-more").is_hidden()
    href = page.locator("#log-download").get_attribute("href")
    assert "rank=1" in href and "format=text" in href
    page.select_option("#log-level", "warning")
    page.wait_for_function("() => document.querySelectorAll('#log-pages li').length === 0")
    page.select_option("#log-rank", "0")
    page.wait_for_function("() => document.querySelectorAll('#log-pages li').length === 12")

    page.fill("#labels-tags", " baseline, ddp , baseline")
    page.fill("#labels-note", "lr 1e-3, two ranks")
    page.get_by_role("button", name="Save").click()
    saved = "() => document.getElementById('labels-status').textContent === 'Saved.'"
    page.wait_for_function(saved)
    assert page.input_value("#labels-tags") == "baseline, ddp"
    run.refresh_from_db()
    assert run.tags == ["baseline", "ddp"] and run.note == "lr 1e-3, two ranks"
    page.locator("#run-logs").scroll_into_view_if_needed()
    screenshot(page, "run-log-rank0-warnings.png")
    assert os.path.exists(ARTIFACTS / "run-log-rank0-warnings.png")


def test_import_shows_the_error_the_api_answers(
    page: Any, live_server: Any, tmp_path: Path
) -> None:
    bad = tmp_path / "notes.csv"
    bad.write_text("not,a,step,column\n1,2,3,4\n")
    page.goto(f"{live_server.url}/")
    page.set_input_files("#import-file", str(bad))
    error = page.locator("#import-error")
    error.wait_for(state="visible")
    assert error.inner_text().startswith("Import refused: ")
    assert len(error.inner_text()) > len("Import refused: ") + 5
    assert Experiment.objects.count() == 0
    good = tmp_path / "mine.csv"
    good.write_text("step,train_loss\n1,0.9\n2,0.5\n")
    page.set_input_files("#import-file", str(good))
    page.wait_for_url("**/experiments/*/")
    (imported,) = Experiment.objects.all()
    assert page.url.endswith(f"/experiments/{imported.pk}/") and imported.imported


def test_more_runs_stops_at_what_one_poll_refreshes(
    page: Any, live_server: Any, experiment_factory: Any
) -> None:
    for i in range(520):
        experiment_factory(owner=page.alice, name=f"many {i:03d}", status=Status.SUCCEEDED)
    page.goto(f"{live_server.url}/")
    rows = page.locator("#experiment-rows tr")
    assert rows.count() == 50
    # One page of 480 more: 530 would be shown, past the 500 one poll asks for.
    page.evaluate(
        """() => { const b = document.getElementById('list-more');
                   const url = new URL(b.dataset.nextUrl, location.href);
                   url.searchParams.set('limit', '480');
                   b.dataset.nextUrl = url.pathname + url.search; }"""
    )
    page.get_by_role("button", name="More runs").click()
    page.locator("#list-full").wait_for()
    assert rows.count() == 500 and page.locator("#list-more").is_hidden()
    assert "500 runs are shown" in page.locator("#list-full").inner_text()
    # A run launched now comes in at the top; the poll still covers every shown row.
    experiment_factory(owner=page.alice, name="newest", status=Status.RUNNING)
    page.wait_for_function(
        "() => document.querySelector('#experiment-rows tr [data-field=name]')"
        ".textContent.includes('newest')"
    )
    assert rows.count() == 500
