"""The run page's phases in a real Chromium (static/js/phases.js): each rank's stacked bar of the
latest window and the phases over time for a run with stored phase points (tests/phase_runs.py,
no training), a live step message moving them, and a run without phases saying so."""

from __future__ import annotations

from typing import Any

import pytest

from tests.docs_screenshots import docs_screenshot
from tests.phase_runs import LAST_DATA, RANK_SECONDS
from tests.stack import Stack
from tests.test_browser import browser, log_in, page, screenshot  # noqa: F401 (fixtures)

# sqlite_only: what is drawn comes from the snapshot's buckets, the same on either engine.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.sqlite_only,
    pytest.mark.timeout(300),
]

DRAWN = "() => TrainyardPhases.drawn()"
# A step message as the socket delivers it, announced where experiment_detail.js announces.
LIVE_STEP = """(step) => document.getElementById("experiment-detail").dispatchEvent(
  new CustomEvent("run:message", { detail: { type: "step", step, ranks: [0, 1].map((rank) => ({
    rank, data_seconds: 0.5, forward_seconds: 0.5, backward_seconds: 0, optimizer_seconds: 0,
    communication_seconds: 0, other_seconds: 0, communication_bytes: 0 })) } }))"""

# A stalled message as the sink sends it (runs/stalls.py), its texts core/stalls.py's.
LIVE_STALLED = """(stalled) => document.getElementById("experiment-detail").dispatchEvent(
  new CustomEvent("run:message", { detail: { type: "stalled", stalled, text: "", level: "info",
    texts: stalled ? { since: "stalled since 10:02:02 UTC",
                       ranks: ["rank 1 never entered all_reduce #42"] }
      : { since: "", ranks: [] } } }))"""
STALLED = {
    "since": "2026-12-06T10:02:02+00:00",
    "text": "No step for 62 s: rank 1 never entered all_reduce #42.",
    "ranks": [{"rank": 1, "collective": "all_reduce #42", "entered": False, "waiting_since": None,
               "stack": 'Thread 0x7e (most recent call first):\n  File "x.py", line 31 in wait'}],
}  # fmt: skip


@pytest.fixture
def tab(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("page")


def run_make(stack: Stack, name: str, windows: int) -> int:
    out = stack.manage(
        "shell", "-c",
        "from tests.phase_runs import phase_run_make; "
        f"print(phase_run_make(owner='alice', name={name!r}, windows={windows}))",
    )  # fmt: skip
    return int(out.strip().splitlines()[-1])


def share(rank: int, phase: str) -> float:
    """The phase's share (percent) of the rank's last window, by hand from the stored seconds."""
    seconds = {**RANK_SECONDS[rank], "data": LAST_DATA}
    return 100 * seconds[phase] / sum(seconds.values())


@pytest.mark.docs_screenshots
def test_the_stacked_bars_and_the_phases_over_time_draw_and_follow_live(
    tab: Any, stack: Stack
) -> None:
    pk = run_make(stack, "phases", windows=4)
    log_in(tab, stack, "alice")
    tab.goto(f"{stack.base_url}/experiments/{pk}/")
    tab.wait_for_selector("#phases[data-phases-state='drawn']", timeout=60_000)
    drawn = tab.evaluate(DRAWN)
    assert sorted(drawn["bars"]) == ["0", "1"]
    for rank in (0, 1):
        for phase, value in drawn["bars"][str(rank)].items():
            assert value == pytest.approx(share(rank, phase), abs=0.01), (rank, phase)
    # Rank 0 over time: a point per window, its shares adding up to 100%.
    x, *phases = drawn["chart"]
    assert x == [10, 20, 30, 40] and len(phases) == 6
    for i in range(4):
        assert sum(p[i] for p in phases) == pytest.approx(100)
    beside = tab.locator("#phase-bars li[data-rank='1']").inner_text()
    assert "1.9 MiB sent per step" in beside  # 2,000,000 bytes a step over 10-step windows
    tab.locator("#phase-bars li[data-rank='0'] [data-phase='communication']").hover()
    screenshot(tab, "phases.png")
    docs_screenshot(tab, "phases")
    # The rank select draws rank 1's shares.
    tab.get_by_label("Over time, rank").select_option("1")
    forward = tab.evaluate(DRAWN)["chart"][2]
    assert forward[0] == pytest.approx(100 * 0.30 / 1.0)
    # A live step message: the bars show its window, the chart gains its point.
    tab.evaluate(LIVE_STEP, 50)
    tab.wait_for_function("() => TrainyardPhases.drawn().chart[0].length === 5")
    assert tab.evaluate(DRAWN)["bars"]["0"]["data"] == pytest.approx(50)
    assert "up to step 50" in tab.locator("#phases-window").inner_text()


def test_a_run_without_phases_says_so_and_draws_no_chart(tab: Any, stack: Stack) -> None:
    pk = run_make(stack, "before 1.9", windows=0)
    log_in(tab, stack, "alice")
    tab.goto(f"{stack.base_url}/experiments/{pk}/")
    tab.wait_for_selector("#phases[data-phases-state='none']", timeout=60_000)
    assert tab.locator("#phases-none").inner_text() == "Phases not measured for this run."
    assert tab.locator("#phases-body").is_hidden()
    assert tab.locator("#phases-chart canvas").count() == 0
    # Nor was it stalled (a run from before protocol 1.13): no banner. Once its socket has said
    # its snapshot (and closed: the run is over), a stalled message shows the banner with each
    # rank's line and its stack folded under it; a null one hides it again.
    assert tab.locator("#stalled-box").is_hidden()
    tab.wait_for_selector("#conn[data-state='closed']", state="attached", timeout=30_000)
    tab.evaluate(LIVE_STALLED, STALLED)
    assert tab.locator("#stalled-box").is_visible()
    assert tab.locator("#stalled-text").inner_text() == STALLED["text"]
    rank = tab.locator("#stalled-ranks li[data-rank='1']")
    assert rank.locator(".stalled-line").inner_text() == "rank 1 never entered all_reduce #42"
    assert rank.locator("pre").is_hidden()  # folded
    rank.locator("summary").click()
    assert 'File "x.py", line 31 in wait' in rank.locator("pre").inner_text()
    tab.evaluate(LIVE_STALLED, None)
    assert tab.locator("#stalled-box").is_hidden()
