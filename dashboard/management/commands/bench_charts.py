"""How fast a long run's page draws, and how the run list holds 10,000 runs.

`python manage.py bench_charts` makes, in a throwaway database (a temporary TRAINYARD_HOME and
DATABASE_URL: the user's var/ is never touched), two finished runs of 10,000 and 100,000 steps
(train loss and images/s at every step, test loss and accuracy ten times) with one train-loss
point of SPIKE_VALUE hidden among them, and 10,000 runs for the list. It starts daphne with the
Procfile's flags and a throwaway Redis (dashboard/serving.py), loads each run page in headless
Chromium (Playwright, /usr/bin/chromium) and prints, per run:

- time from navigation to `data-charts-ready="true"` on <main> (every chart drew its snapshot);
- bytes of the page and of the WebSocket snapshot (goal: independent of the point count past the
  bucket budget, so the 100k / 10k ratio near 1);
- whether the spike is drawn: the largest train-loss value the page's charts hold (asked from the
  page when its charts expose their data, else read from the snapshot's buckets) >= the spike;

then the list page's and `GET /api/experiments/`'s server time with 10,000 runs (median of a few
requests on localhost) and their bytes. Goals are printed beside the figures. `--dry-run` takes
tiny sizes through the same code path.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from dashboard.management.throwaway import ThrowawayBenchCommand
from dashboard.serving import (
    CHROMIUM,
    CHROMIUM_ARGS,
    servers_running,
    session_cookie,
)

SPIKE_VALUE = 1000.0  # a train loss ~2,000 times the curve's: one point, where a mean hides it
SIZES = (10_000, 100_000)
DRY_SIZES = (200, 2_000)
LIST_RUNS, DRY_LIST_RUNS = 10_000, 50
REQUESTS = 5  # per list measurement; the median is printed
READY_TIMEOUT_S = 60
SNAPSHOT_WAIT_S = 30
GOAL_READY_S, GOAL_LIST_MS = 1.0, 300.0

# Set before any page script runs: the moment <main> says every chart drew, on the page's clock
# (performance.now() counts from navigation start).
READY_PROBE = """
window.__benchReadyAt = null;
new MutationObserver((_, observer) => {
  const main = document.querySelector("main");
  if (main && main.dataset.chartsReady === "true" && window.__benchReadyAt === null) {
    window.__benchReadyAt = performance.now();
    observer.disconnect();
  }
}).observe(document, { attributes: true, subtree: true, attributeFilter: ["data-charts-ready"] });
"""
FIRST_BYTE = """() => performance.getEntriesByType("navigation")[0].responseStart"""
EMBEDDED_BYTES = """() => {
  const script = document.getElementById("experiment-snapshot");
  return script ? new TextEncoder().encode(script.textContent).length : null;
}"""
# The largest value the page's train-loss chart hands uPlot (every line of it: the min/max band
# and the mean), where the chart component exposes its charts (static/js/charts.js: instances, by
# chart id, each with its uPlot as `u`); null where it does not.
PAGE_MAX = """() => {
  const charts = window.TrainyardCharts;
  const chart = charts && charts.instances && charts.instances.get("train_loss");
  if (!chart || !chart.u) return null;
  let max = null;
  for (const values of chart.u.data.slice(1)) {
    for (const v of values) if (Number.isFinite(v) && (max === null || v > max)) max = v;
  }
  return max;
}"""


def run_with_points_create(
    *, owner: Any, name: str, steps: int, keys: tuple[str, ...], spike_step: int | None = None
) -> Any:
    """A finished run of `steps` steps with a point per step of each of `keys` (train_loss at
    SPIKE_VALUE at `spike_step`), and test loss and accuracy ten times over the run. Shared with
    tests/test_snapshot_size.py (a 5-epoch Fashion-MNIST run's length)."""
    from django.utils import timezone

    from dashboard.experiments.models import Experiment, SeriesPoint, Status

    epochs = 10
    experiment = Experiment.objects.create(
        owner=owner,
        name=name,
        strategy="single",
        processes=1,
        dataset="fashion-mnist",
        epochs=epochs,
        status=Status.SUCCEEDED,
        started_at=timezone.now(),
        finished_at=timezone.now(),
        epoch=epochs,
        step=steps,
        total_steps=steps,
        last_seq=steps + epochs,
        test_loss=0.3,
        test_accuracy=0.9,
        worker="bench",
    )
    rows = list(_series_rows(steps=steps, keys=keys, spike_step=spike_step, epochs=epochs))
    SeriesPoint.objects.bulk_create(
        [SeriesPoint(experiment=experiment, key=k, step=s, time=t, value=v) for k, s, t, v in rows],
        batch_size=5000,
    )
    return experiment


def _series_rows(
    *, steps: int, keys: tuple[str, ...], spike_step: int | None, epochs: int
) -> Iterator[tuple[str, int, float, float]]:
    """(key, step, time, value): a loss that falls with noise, steady figures for the rest."""
    for step in range(1, steps + 1):
        when = step * 0.05
        for key in keys:
            if key == "train_loss":
                noise = 0.05 * ((step * 7919) % 13) / 13
                value = SPIKE_VALUE if step == spike_step else 2.3 / (1 + step / 500) + noise
            else:
                value = 1000.0 + step % 17
            yield key, step, when, value
        if step % max(1, steps // epochs) == 0:
            yield "test_loss", step, when, 2.0 / (1 + step / 500)
            yield "test_accuracy", step, when, min(0.99, 0.5 + step / (2 * steps))


@dataclass(frozen=True)
class PageFigures:
    steps: int
    ready_s: float | None
    first_byte_s: float  # the page's server time (and the way there), within ready_s
    page_bytes: int
    embedded_bytes: int | None  # the snapshot inside the page (json_script)
    snapshot_bytes: int | None  # the socket's first message
    data_max: float | None
    data_max_from: str


def snapshot_train_loss_max(snapshot: dict[str, Any]) -> float | None:
    """The largest train loss a snapshot carries: its buckets' max."""
    buckets = snapshot["series"].get("train_loss", {}).get("buckets", [])
    return max((b[5] for b in buckets if b[5] is not None), default=None)


class Command(ThrowawayBenchCommand):
    help = (
        "Load 10,000- and 100,000-point run pages in Chromium (time to charts drawn, page and "
        "snapshot bytes, spike drawn) and time the run list with 10,000 runs; goals beside."
    )

    bench_name = "bench_charts"
    dry_run_help = "tiny sizes through the same path: checks it"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--screenshots", metavar="DIR", help="save each run page (1366x900) as DIR/run-N.png"
        )

    def child_options(self, options: dict[str, Any]) -> list[str]:
        folder = options["screenshots"]
        extra = [f"--screenshots={Path(folder).resolve()}"] if folder else []
        return [*super().child_options(options), *extra]

    def bench(self, *, owner: Any, options: dict[str, Any]) -> None:
        dry_run = options["dry_run"]
        sizes = DRY_SIZES if dry_run else SIZES
        runs = [
            run_with_points_create(
                owner=owner,
                name=f"{steps:,} points",
                steps=steps,
                keys=("train_loss", "images_per_second"),
                spike_step=steps * 6137 // 10_000,
            )
            for steps in sizes
        ]
        list_runs = DRY_LIST_RUNS if dry_run else LIST_RUNS
        self._list_runs_create(owner=owner, count=list_runs - len(runs))
        self.stdout.write(
            f"bench_charts: {', '.join(f'{s:,}' for s in sizes)}-point runs (a {SPIKE_VALUE:g} "
            f"train-loss spike in each), {list_runs:,} runs in the list"
            + (", dry run" if dry_run else "")
            + f"; daphne with the Procfile's flags, Chromium at {CHROMIUM}"
        )
        with servers_running(home=Path(settings.VAR_DIR)) as base_url:
            cookie = session_cookie(owner)
            # A served page is what a user meets: the first request's imports and template
            # compiling are not the page's (the smallest run's page once, unmeasured).
            self._get(base_url + runs[0].get_absolute_url(), cookie)
            folder = Path(options["screenshots"]) if options["screenshots"] else None
            pages = [self._page_measure(base_url, cookie, run, folder) for run in runs]
            for run, figures in zip(runs, pages, strict=True):
                self._page_print(figures)
                self._metrics_print(base_url, cookie, run)
            self._pages_summary(pages)
            self._list_print(base_url, cookie, list_runs)

    @staticmethod
    def _list_runs_create(*, owner: Any, count: int) -> None:
        from dashboard.experiments.models import Experiment, Status

        statuses = [Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.SUCCEEDED]
        Experiment.objects.bulk_create(
            [
                Experiment(owner=owner, name=f"list run {i}", status=statuses[i % 4], epochs=1)
                for i in range(count)
            ],
            batch_size=2000,
        )

    def _page_measure(
        self, base_url: str, cookie: str, run: Any, screenshots: Path | None
    ) -> PageFigures:
        from playwright.sync_api import sync_playwright

        frames: list[str | bytes] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": 1366, "height": 900})
                context.add_cookies(
                    [{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": base_url}]
                )
                context.add_init_script(READY_PROBE)
                page = context.new_page()
                page.on(
                    "websocket",
                    lambda ws: ws.on("framereceived", lambda payload: frames.append(payload)),
                )
                response = page.goto(f"{base_url}{run.get_absolute_url()}")
                if response is None or not response.ok:
                    raise CommandError(f"the run page answered {response and response.status}")
                page_bytes = len(response.body())
                ready_s = self._ready_wait(page)
                embedded_bytes = page.evaluate(EMBEDDED_BYTES)
                first_byte_s = float(page.evaluate(FIRST_BYTE)) / 1000
                page_max = page.evaluate(PAGE_MAX)
                self._snapshot_wait(page, frames)
                if screenshots is not None:
                    screenshots.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(screenshots / f"run-{run.step}.png"), full_page=True)
            finally:
                browser.close()
        snapshot = _first_snapshot(frames)
        snapshot_bytes = None if snapshot is None else len(snapshot[0])
        data_max: float | None = None if page_max is None else float(page_max)
        source = "the page's charts"
        if data_max is None:
            data_max = None if snapshot is None else snapshot_train_loss_max(snapshot[1])
            source = "the snapshot's buckets"
        return PageFigures(
            run.step, ready_s, first_byte_s, page_bytes, embedded_bytes, snapshot_bytes,
            data_max, source,
        )  # fmt: skip

    @staticmethod
    def _snapshot_wait(page: Any, frames: list[str | bytes]) -> None:
        """Until the socket's snapshot arrived (it may follow the charts drawn from the embedded
        one), or SNAPSHOT_WAIT_S."""
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        while _first_snapshot(frames) is None and time.monotonic() < deadline:
            page.wait_for_timeout(100)

    @staticmethod
    def _ready_wait(page: Any) -> float | None:
        try:
            page.wait_for_function(
                "() => window.__benchReadyAt !== null", timeout=READY_TIMEOUT_S * 1000
            )
        except Exception:  # Playwright's TimeoutError: the page never said its charts drew
            return None
        return float(page.evaluate("() => window.__benchReadyAt")) / 1000

    def _page_print(self, f: PageFigures) -> None:
        ready = "not set" if f.ready_s is None else f"{f.ready_s:.3f}"
        spike = "no data" if f.data_max is None else ("yes" if f.data_max >= SPIKE_VALUE else "no")
        snapshot = "none received" if f.snapshot_bytes is None else f"{f.snapshot_bytes}"
        self.stdout.write(f"run page, {f.steps} points:")
        self.stdout.write(f"  charts ready s: {ready}  (goal <= {GOAL_READY_S:g} s at 100,000)")
        self.stdout.write(f"  first byte s: {f.first_byte_s:.3f}  (of which the server's page)")
        self.stdout.write(f"  page bytes: {f.page_bytes}")
        self.stdout.write(f"  embedded snapshot bytes: {f.embedded_bytes}")
        self.stdout.write(f"  socket snapshot bytes: {snapshot}")
        self.stdout.write(
            f"  spike drawn: {spike} (train-loss max {f.data_max} from {f.data_max_from}; "
            f"spike {SPIKE_VALUE:g})"
        )

    def _pages_summary(self, pages: list[PageFigures]) -> None:
        small, large = pages[0], pages[-1]
        points = large.steps / small.steps
        self.stdout.write(
            f"page bytes ratio: {large.page_bytes / small.page_bytes:.2f} for {points:g}x the "
            "points (goal: about 1, independent of the point count)"
        )
        if small.snapshot_bytes and large.snapshot_bytes:
            self.stdout.write(
                f"socket snapshot bytes ratio: {large.snapshot_bytes / small.snapshot_bytes:.2f} "
                f"for {points:g}x the points (goal: about 1 past the bucket budget)"
            )

    @staticmethod
    def _get(url: str, cookie: str) -> tuple[float, int]:
        """GET as the logged-in user: milliseconds to the whole body, and its bytes."""
        import requests

        started = time.perf_counter()
        response = requests.get(url, cookies={settings.SESSION_COOKIE_NAME: cookie}, timeout=60)
        elapsed = (time.perf_counter() - started) * 1000
        response.raise_for_status()
        return elapsed, len(response.content)

    def _median_get(self, url: str, cookie: str) -> tuple[float, int]:
        """The median milliseconds of REQUESTS GETs (localhost: the server's time), and bytes."""
        answers = [self._get(url, cookie) for _ in range(REQUESTS)]
        return statistics.median(ms for ms, _ in answers), answers[-1][1]

    def _metrics_print(self, base_url: str, cookie: str, run: Any) -> None:
        """The server's bucketing alone: the metrics API, as the page's snapshot buckets."""
        ms, size = self._median_get(f"{base_url}/api/experiments/{run.pk}/metrics/", cookie)
        self.stdout.write(
            f"  metrics API ms: {ms:.1f}  (GET .../metrics/, median of {REQUESTS}, {size} bytes)"
        )

    def _list_print(self, base_url: str, cookie: str, runs: int) -> None:
        for name, path in (("list page", "/"), ("list API", "/api/experiments/")):
            ms, size = self._median_get(base_url + path, cookie)
            self.stdout.write(
                f"{name} ms: {ms:.1f}  ({runs:,} runs, GET {path}, median "
                f"of {REQUESTS} on localhost, {size} bytes; goal <= {GOAL_LIST_MS:g} ms)"
            )


def _first_snapshot(frames: list[str | bytes]) -> tuple[bytes, dict[str, Any]] | None:
    for frame in frames:
        raw = frame.encode() if isinstance(frame, str) else frame
        message = json.loads(raw)
        if message.get("type") == "snapshot":
            return raw, message
    return None
