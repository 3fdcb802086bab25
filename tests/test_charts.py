"""The run page's charts in a real Chromium (static/js/charts.js, uPlot): a spike among 100,000
points is drawn, smoothing changes the drawn curve and not the data, the log toggle, the x-axis
switch, and a drag-zoom that asks the metrics API for finer buckets.

Runs are made directly in the stack's database (tests/chart_runs.py). Screenshots land in
test-artifacts/ for a person to look at; the timings printed are figures, not assertions.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dashboard.experiments.core.memory import memory_rows
from tests.chart_runs import COMPUTE_PER_STEP, SPIKE_VALUE, WINDOW_ENDS
from tests.stack import Stack
from tests.test_browser import ARTIFACTS, browser, log_in, page, screenshot, start_run  # noqa: F401 (fixtures)

# sqlite_only: what a chart draws from the buckets is the same on either engine; the buckets' SQL
# is checked on PostgreSQL by tests/test_series.py (test_the_same_buckets_on_postgres).
pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.sqlite_only,
    pytest.mark.timeout(400),
]

READY = "main[data-charts-ready='true']"
TRAIN = "train_loss"
LINE = "Training loss"

DRAWN = "(id) => TrainyardCharts.instances.get(id).drawn()"
# The spike's column in the canvas against one in the middle of the plot, at 80% of the spike's
# height: a pixel of the line's colour (indigo: far more blue than red) there, or not.
SPIKE_PIXELS = """(id) => {
  const chart = TrainyardCharts.instances.get(id), u = chart.u, d = chart.drawn();
  const line = Object.values(d.lines)[0];
  let i = 0;
  for (let k = 0; k < line.max.length; k++) if (line.max[k] > line.max[i]) i = k;
  const y = Math.round(u.valToPos(line.max[i] * 0.8, "y", true));
  const colored = (x) => {
    const img = u.ctx.getImageData(x - 2, y - 2, 5, 5).data;
    for (let k = 0; k < img.length; k += 4) {
      if (img[k + 3] > 0 && img[k + 2] - img[k] > 60) return true;
    }
    return false;
  };
  return {
    max: line.max[i],
    atSpike: colored(Math.round(u.valToPos(d.x[i], "x", true))),
    elsewhere: colored(Math.round(u.bbox.left + u.bbox.width * 0.5)),
  };
}"""


@pytest.fixture
def tab(request: pytest.FixtureRequest) -> Any:
    """test_browser's page fixture (its name taken here would shadow the import)."""
    return request.getfixturevalue("page")


def run_make(stack: Stack, *, owner: str, name: str, points: int, **extra: Any) -> int:
    args = ", ".join(
        f"{k}={v!r}" for k, v in {"owner": owner, "name": name, "points": points, **extra}.items()
    )
    out = stack.manage(
        "shell", "-c", f"from tests.chart_runs import chart_run_make; print(chart_run_make({args}))"
    )
    return int(out.strip().splitlines()[-1])


def open_run(tab: Any, stack: Stack, pk: int) -> float:
    """Seconds from navigation to every chart drawn."""
    started = time.perf_counter()
    tab.goto(f"{stack.base_url}/experiments/{pk}/")
    tab.wait_for_selector(READY, timeout=60_000)
    seconds = time.perf_counter() - started
    # A finished run's page still takes one snapshot over the socket, then closes it.
    tab.wait_for_selector("#conn[data-state='closed']", timeout=30_000)
    return seconds


@pytest.fixture(scope="module")
def big_run(stack: Stack) -> int:
    return run_make(stack, owner="alice", name="chart 100k", points=100_000, spike_step=61_234)


def test_a_spike_among_100k_points_is_drawn(tab: Any, stack: Stack, big_run: int) -> None:
    log_in(tab, stack, "alice")
    small = run_make(stack, owner="alice", name="chart 10k", points=10_000, spike_step=4_321)
    for pk, points in ((small, 10_000), (big_run, 100_000)):
        seconds = open_run(tab, stack, pk)
        print(f"{points} points: navigation to data-charts-ready {seconds:.2f} s")  # noqa: T201
        drawn = tab.evaluate(DRAWN, TRAIN)
        assert 100 < len(drawn["x"]) <= 2000  # buckets, not points
        pixels = tab.evaluate(SPIKE_PIXELS, TRAIN)
        assert pixels["max"] == SPIKE_VALUE
        assert pixels["atSpike"] and not pixels["elsewhere"], pixels
    assert "min–max band" in tab.locator("[data-chart='train_loss'] .chart-note").inner_text()
    screenshot(tab, "charts-100k-spike.png")


def test_smoothing_changes_the_drawn_curve_not_the_data(
    tab: Any, stack: Stack, big_run: int
) -> None:
    log_in(tab, stack, "alice")
    open_run(tab, stack, big_run)
    data = """(id) => JSON.stringify(
        [...TrainyardCharts.instances.get(id).lines.values()].map(l => l.buckets))"""
    before, stored = tab.evaluate(DRAWN, TRAIN), tab.evaluate(data, TRAIN)
    assert all(v is None for v in before["lines"][LINE]["smoothed"])
    tab.get_by_label("Training loss: smoothing").fill("0.9")
    after = tab.evaluate(DRAWN, TRAIN)
    smoothed, mean = after["lines"][LINE]["smoothed"], after["lines"][LINE]["mean"]
    assert mean == before["lines"][LINE]["mean"] and tab.evaluate(data, TRAIN) == stored
    spike = after["lines"][LINE]["max"].index(SPIKE_VALUE)
    assert smoothed != mean and smoothed[spike] < mean[spike]  # the spike's bucket averaged down
    # Debiased: the first smoothed value is the first value itself, not 10% of it.
    assert smoothed[0] == pytest.approx(mean[0])
    note = tab.locator("[data-chart='train_loss'] .chart-note").inner_text()
    assert "bucket means" in note
    screenshot(tab, "charts-smoothed.png")


def test_log_scale_and_x_axis_switch(tab: Any, stack: Stack, big_run: int) -> None:
    log_in(tab, stack, "alice")
    open_run(tab, stack, big_run)
    steps = tab.evaluate(DRAWN, TRAIN)["x"]
    # Axis and hover numbers: whole numbers keep their zeros, long ones are shortened.
    texts = tab.evaluate(
        "() => [1000, 50, 0.25, 1.23456, 2e-5].map(v => TrainyardCharts.numberText(v))"
    )
    assert texts == ["1000", "50", "0.25", "1.235", "2.000e-5"]
    tab.get_by_label("Training loss: log scale").check()
    assert tab.evaluate(DRAWN, TRAIN)["log"] is True
    tab.get_by_label("X axis").select_option("images")
    assert tab.evaluate(DRAWN, TRAIN)["x"] == [s * 64 for s in steps]  # global batch 64
    tab.get_by_label("X axis").select_option("time")
    assert tab.evaluate(DRAWN, TRAIN)["x"] == pytest.approx([s * 0.01 for s in steps])
    tab.get_by_label("X axis").select_option("wall")
    wall = tab.evaluate(DRAWN, TRAIN)["x"]
    assert wall[-1] - wall[0] == pytest.approx((steps[-1] - steps[0]) * 0.01) and wall[0] > 1.7e9
    assert tab.evaluate(DRAWN, TRAIN)["log"] is True  # the toggle outlives the switch
    screenshot(tab, "charts-log-wall.png")


def test_drag_zoom_asks_for_finer_buckets(tab: Any, stack: Stack, big_run: int) -> None:
    log_in(tab, stack, "alice")
    open_run(tab, stack, big_run)
    full = tab.evaluate(DRAWN, TRAIN)["x"]
    # Below the run's summary: scrolled to, as a reader does, so that the mouse reaches it.
    tab.locator("[data-chart='train_loss']").scroll_into_view_if_needed()
    over = tab.locator("[data-chart='train_loss'] .u-over").bounding_box()
    y = over["y"] + over["height"] / 2
    # Hover: the values under the cursor, the bucket's min-max beside its mean.
    tab.mouse.move(over["x"] + over["width"] * 0.5, y)
    hover = tab.locator("[data-chart='train_loss'] .chart-hover").inner_text()
    assert hover.startswith("step ") and "–" in hover, hover
    with tab.expect_response(lambda r: "/metrics/" in r.url and "from=" in r.url) as answer:
        tab.mouse.move(over["x"] + over["width"] * 0.30, y)
        tab.mouse.down()
        tab.mouse.move(over["x"] + over["width"] * 0.40, y, steps=5)
        tab.mouse.up()
    assert "keys=train_loss" in answer.value.url and answer.value.status == 200
    tab.wait_for_function(
        "() => TrainyardCharts.instances.get('train_loss').lines.get('Training loss').zoom"
    )
    tab.wait_for_timeout(100)
    zoomed = tab.evaluate(DRAWN, TRAIN)["x"]
    # About a tenth of the run, in about as many buckets as the whole: ~10x finer.
    assert zoomed[0] > 25_000 and zoomed[-1] < 45_000 and len(zoomed) > 400
    assert (zoomed[-1] - zoomed[0]) / len(zoomed) < (full[-1] - full[0]) / len(full) / 5
    screenshot(tab, "charts-zoomed.png")
    tab.locator("[data-chart='train_loss']").get_by_role("button", name="Reset zoom").click()
    assert tab.evaluate(DRAWN, TRAIN)["x"] == full


# Buckets of one compared run's train_loss line.
RUN_BUCKETS = """() => {
  const chart = TrainyardCharts.instances.get('train_loss');
  const line = chart && [...chart.lines.values()].find(l => l.meta.run.id === %d);
  return line ? line.buckets.length : 0;
}"""


def test_compare_overlays_runs_and_follows_the_one_training(tab: Any, stack: Stack) -> None:
    log_in(tab, stack, "bob")
    done = run_make(stack, owner="bob", name="finished single", points=400)
    start_run(tab, stack, name="compare live", epochs=3)
    live = int(tab.url.rstrip("/").rsplit("/", 1)[1])
    tab.goto(f"{stack.base_url}/experiments/compare/?ids={done},{live}")
    tab.wait_for_selector(READY, timeout=60_000)
    assert tab.get_by_label("X axis").input_value() == "images"
    assert "global batch sizes differ" in tab.locator("#chart-x-why").inner_text()
    # The training run's points arrive over its socket, without a reload.
    tab.wait_for_function(f"() => ({RUN_BUCKETS % live})() >= 2", timeout=120_000)
    first = tab.evaluate(RUN_BUCKETS % live)
    tab.wait_for_function(f"() => ({RUN_BUCKETS % live})() > {first}", timeout=120_000)
    drawn = tab.evaluate(DRAWN, TRAIN)
    assert len(drawn["lines"]) == 2 and drawn["xMode"] == "images"
    legend = tab.locator("[data-chart='train_loss'] .chart-legend li")
    assert legend.count() == 2 and "compare live" in legend.nth(1).inner_text()
    # Every series of either run has a chart, the scaling chart beside them.
    assert tab.locator("[data-chart='images_per_second'] canvas").count() == 1
    assert tab.locator("#scaling-chart canvas").count() == 1
    screenshot(tab, "compare-live.png")
    # Seen: the rest of its epochs would take cores the pass's other tests need (409: it ended).
    stopped = stack.login("bob").post(f"{stack.base_url}/api/experiments/{live}/stop/", timeout=10)
    assert stopped.status_code in (202, 409), stopped.text


# Zoom inside one bucket of the middle, with fetchRange recording what it was asked for.
ZOOM_IN_ONE_BUCKET = """async () => {
  const chart = TrainyardCharts.instances.get('train_loss');
  const line = chart.lines.get('Training loss');
  const b = line.buckets[Math.floor(line.buckets.length / 2)];
  const lo = b[0] + (b[1] - b[0]) / 4, hi = b[0] + (b[1] - b[0]) * 3 / 4;
  const asked = [];
  chart.fetchRange = async (l, from, to) => { asked.push([from, to]); return null; };
  await chart.zoomTo(lo, hi);
  return { lo, hi, asked };
}"""


def test_zoom_inside_one_bucket_asks_for_its_steps(tab: Any, stack: Stack, big_run: int) -> None:
    log_in(tab, stack, "alice")
    open_run(tab, stack, big_run)
    got = tab.evaluate(ZOOM_IN_ONE_BUCKET)
    assert got["hi"] - got["lo"] > 10  # buckets of ~100 steps: a selection of some width
    ((from_, to),) = got["asked"]
    assert from_ <= got["lo"] and to >= got["hi"], got


# Live samples at the line's last step: a later time is a new sample, the same time is not.
APPEND_AT_ONE_STEP = """() => {
  const chart = TrainyardCharts.instances.get('train_loss');
  const line = chart.lines.get('Training loss');
  const last = line.buckets[line.buckets.length - 1], before = line.buckets.length;
  const step = last[1], time = last[3];
  chart.append('Training loss', [[step, time, 1], [step, time + 2, 1], [step, time + 4, 1]]);
  chart.append('Training loss', [[step, time + 4, 1], [step - 1, time + 6, 1]]);
  return line.buckets.length - before;
}"""


def test_live_samples_at_one_step_are_kept(tab: Any, stack: Stack) -> None:
    log_in(tab, stack, "alice")
    open_run(tab, stack, run_make(stack, owner="alice", name="chart one step", points=50))
    assert tab.evaluate(APPEND_AT_ONE_STEP) == 2


# common.js runSocket on two runs at once: its states, and the snapshots it handed on.
FOLLOW = """async ([mine, theirs]) => {
  const follow = (pk) => new Promise((resolve) => {
    const got = { states: [], snapshots: 0 };
    Trainyard.runSocket("/ws/experiments/" + pk + "/", {
      isFinal: () => got.snapshots > 0,
      checkUrl: "/api/experiments/" + pk + "/",
      onSnapshot: () => { got.snapshots += 1; },
      onEvent: () => {},
      onState: (kind, text) => {
        got.states.push(text);
        // A while after closing, to see that no reconnect follows.
        if (kind === "closed") setTimeout(() => resolve(got), 2500);
      },
    });
  });
  return Promise.all([follow(mine), follow(theirs)]);
}"""


def test_the_run_socket_closes_after_a_final_snapshot_and_at_a_refusal(
    tab: Any, stack: Stack
) -> None:
    mine = run_make(stack, owner="alice", name="socket mine", points=10)
    theirs = run_make(stack, owner="bob", name="socket theirs", points=10)
    log_in(tab, stack, "alice")
    own, refused = tab.evaluate(FOLLOW, [mine, theirs])
    # A finished run: one snapshot, then closed for good (no reconnect).
    assert own == {"states": ["connecting…", "live", "closed"], "snapshots": 1}
    # Another user's run: the refused handshake looks like a drop; the API says why, and it stops.
    assert refused == {"states": ["connecting…", "closed: not allowed"], "snapshots": 0}


# charts.js reads the series contract from the page facts: a live step's figures under the
# sink's keys, and a per-rank key's chart and line.
CONTRACT = """() => ({
  points: TrainyardCharts.messagePoints({ type: "step", step: 3, time: 1.5, train_loss: 0.5,
                                          ranks: [{ rank: 1, images_per_second: 9 }] }),
  epoch: TrainyardCharts.messagePoints({ type: "epoch", step: 4, images_per_second: 7 }),
  memory: TrainyardCharts.messagePoints({ type: "epoch", step: 4, time: 2, memory: [{
    rank: 1, parameter_bytes: 8, gradient_bytes: 8, optimizer_state_bytes: 20, peak_bytes: 99 }] }),
  memoryChart: [TrainyardCharts.specOf("rank/1/parameter_bytes").spec.id,
                TrainyardCharts.specOf("rank/1/parameter_bytes").line,
                TrainyardCharts.specOf("rank/1/parameter_bytes").spec.zero],
  rank: [TrainyardCharts.specOf("rank/1/rss_bytes").spec.id,
         TrainyardCharts.specOf("rank/1/rss_bytes").line],
  gpu: TrainyardCharts.specOf("gpu/host-a/0/memory_bytes").line,
  ids: TrainyardCharts.SPECS.map((s) => s.id),
  served: Trainyard.facts.series.charts.map((s) => s.id),
})"""


# run_facts.js places an epoch message's memory rows (the sink's, core/memory.py) as they are.
MEMORY_LIVE = """(rows) => {
  const table = document.getElementById("memory-table"), before = table.hidden;
  document.getElementById("experiment-detail").dispatchEvent(new CustomEvent("run:message",
    { detail: { type: "epoch", seq: 1e9, step: 4, epoch: 1, texts: { memory: rows } } }));
  const cells = [...document.querySelectorAll("#memory-body tr")]
    .map((tr) => [...tr.cells].map((td) => td.textContent.trim()));
  return { before, after: table.hidden, cells,
           bar: document.querySelector("#memory-body .held").style.width };
}"""


def test_the_charts_come_from_the_page_facts_series_contract(tab: Any, stack: Stack) -> None:
    pk = run_make(stack, owner="alice", name="contract", points=10)
    log_in(tab, stack, "alice")
    open_run(tab, stack, pk)
    got = tab.evaluate(CONTRACT)
    assert got["points"] == {
        "train_loss": [[3, 1.5, 0.5]],
        "rank/1/images_per_second": [[3, 1.5, 9]],
    }
    assert got["epoch"] == {"epoch/images_per_second": [[4, None, 7]]}
    assert got["rank"] == ["rank_rss", "rank 1"]
    assert got["gpu"] == "host-a GPU 0"
    assert got["ids"] == got["served"] and got["ids"][0] == "train_loss"
    # An epoch's memory (protocol 1.7) under the sink's keys, on a chart drawn from 0.
    assert got["memory"] == {
        f"rank/1/{field}": [[4, 2, value]]
        for field, value in (("parameter_bytes", 8), ("gradient_bytes", 8),
                             ("optimizer_state_bytes", 20), ("peak_bytes", 99))
    }  # fmt: skip
    assert got["memoryChart"] == ["rank_parameters", "rank 1", True]
    # FSDP x2: each rank holds half of a 1,024-parameter model (4 KiB in float32).
    fsdp = [{"rank": r, "parameter_bytes": 2048, "gradient_bytes": 2048,
             "optimizer_state_bytes": 4100, "peak_bytes": 250 * 2**20} for r in (0, 1)]  # fmt: skip
    live = tab.evaluate(MEMORY_LIVE, memory_rows(fsdp, model_bytes=4096))
    assert (live["before"], live["after"], live["bar"]) == (True, False, "50%")
    assert live["cells"][1] == ["1", "2.0 KiB", "50%", "2.0 KiB", "4.0 KiB", "8.0 KiB", "250.0 MiB"]


def test_a_short_window_is_drawn_per_step_and_marked(tab: Any, stack: Stack) -> None:
    """Issue 34 item 9: an epoch's short last window read as a drop in Compute and images/s.
    Compute is drawn per step (flat: every step took the same), and both charts mark the
    windows shorter than the usual 20 steps, with their step count on hover."""
    out = stack.manage(
        "shell", "-c",
        "from tests.chart_runs import window_run_make; "
        "print(window_run_make(owner='alice', name='windows'))",
    )  # fmt: skip
    log_in(tab, stack, "alice")
    open_run(tab, stack, int(out.strip().splitlines()[-1]))
    compute = tab.evaluate(DRAWN, "compute_seconds")["lines"]["Compute per step (s)"]
    assert compute["mean"] == pytest.approx([COMPUTE_PER_STEP] * len(WINDOW_ENDS))
    short_steps = [1, 47, 60, 94, 100, 141]  # windows of 1, 7, 13, 14, 6 and 1 steps
    for chart in ("compute_seconds", "images_per_second"):
        drawn = tab.evaluate(DRAWN, chart)
        line = next(iter(drawn["lines"].values()))
        marked = [x for x, v in zip(drawn["x"], line["short"], strict=True) if v is not None]
        assert marked == short_steps, chart
    assert tab.evaluate(DRAWN, "images_per_second")["x"] == list(WINDOW_ENDS)
    over = tab.locator("#chart-images_per_second .u-over")
    # The hover names the short window's steps: the point at step 47 (7 of the usual 20).
    x = tab.evaluate("() => TrainyardCharts.instances.get('images_per_second').u.valToPos(47, 'x')")
    over.hover(position={"x": x, "y": 10})
    hover = tab.locator("[data-chart='images_per_second'] .chart-hover")
    assert "a window of 7 steps (most have 20)" in hover.inner_text()
    note = tab.locator("[data-chart='compute_seconds'] .chart-note").inner_text()
    assert "Ringed points: windows shorter than most" in note and "per step" in note
    # A line that starts late: its first point counts as a usual window, not all steps since 0.
    out = stack.manage(
        "shell", "-c",
        "from tests.chart_runs import window_run_make; "
        "print(window_run_make(owner='alice', name='late', start=200))",
    )  # fmt: skip
    open_run(tab, stack, int(out.strip().splitlines()[-1]))
    late = tab.evaluate(DRAWN, "compute_seconds")["lines"]["Compute per step (s)"]
    assert late["mean"] == pytest.approx([COMPUTE_PER_STEP] * (len(WINDOW_ENDS) - 1))
    tab.locator("[data-chart='images_per_second']").screenshot(
        path=str(ARTIFACTS / "charts-short-windows.png")
    )
