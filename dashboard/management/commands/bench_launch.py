"""How long a user waits from launching a run to its first point, beside a bare start of the
same training command, for `single` and `ddp` (2 ranks under torchrun).

`python manage.py bench_launch [--rounds N] [--dry-run]`, in a throwaway home (database, runs
folder, Redis; see dashboard/serving.py), starts a real Celery worker as the Procfile does (its
concurrency, the shared queue and its machine's) and waits until it answers a ping: a user's
worker is already up when they launch. Then each round, per strategy, alternately:

dashboard  `experiment_launch` (the service the form and the JSON API call), timed from the call
           to the run's first stored step point (a SeriesPoint of its step events) and to its
           status `running`. Included: the row's commit, the message through Redis to the worker,
           the claim, the supervisor's start of the training interpreter (and torchrun's ranks),
           the training's import, data and model set-up, its first step, the event read, parsed
           and stored. Not included: the HTTP request of the form or the API (a few ms: one
           query of the launch limits, skipped here so that many rounds are not refused by the
           launches-a-minute limit), the page's socket and the worker's own start.
bare       the same command line and environment the supervisor builds (runner's
           training_command and training_environment, without the supervisor's variables),
           timed from Popen to its first `step` event on stdout.

Both sides run to the training's end before the next starts, so one never loads the other and no
row is left queued to hold the next launch behind it (the queue's turn rule). The database is
polled every POLL_SECONDS for the dashboard's figures: their resolution. Printed: a table per
round, the spread (min-max) per strategy and side, the medians, and last `launch ratio: X`
(median dashboard seconds to first point / median bare seconds to first step, over both
strategies).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from dashboard.management.throwaway import ThrowawayBenchCommand, throwaway_child
from dashboard.serving import ROOT, process_running, redis_command, wait_for

STRATEGIES = {"single": 1, "ddp": 2}  # strategy: processes
POLL_SECONDS = 0.02
FIRST_POINT_KEY = "images_per_second"  # a key of every step event's points
WORKER_CONCURRENCY = "2"  # the Procfile's default


@dataclass(frozen=True)
class Launch:
    round: int
    strategy: str
    side: str  # "dashboard" or "bare"
    first_point_s: float
    running_s: float | None = None  # the dashboard's only


class Command(ThrowawayBenchCommand):
    help = (
        "Seconds from launching a single and a 2-rank DDP run through the dashboard to its first "
        "stored point, beside a bare start of the same command to its first step event; last "
        "line `launch ratio: X`."
    )

    bench_name = "bench_launch"
    dry_run_help = "one batch per epoch on both sides: checks the path only"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--rounds", type=int, default=2, help="rounds (default: 2)")
        parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
        parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)

    def child_options(self, options: dict[str, Any]) -> list[str]:
        rounds, timeout = f"--rounds={options['rounds']}", f"--timeout={options['timeout']}"
        return [*super().child_options(options), rounds, timeout]

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rounds"] < 1:
            raise CommandError("--rounds must be at least 1")
        if options["worker"]:
            if not throwaway_child():
                raise CommandError("--worker is the benchmark's own, in its throwaway home")
            worker_main(dry_run=options["dry_run"])
            return
        super().handle(*args, **options)

    def bench(self, *, owner: Any, options: dict[str, Any]) -> None:
        self.stdout.write(
            f"bench_launch: {', '.join(STRATEGIES)} (ddp: 2 ranks, torchrun), mnist, 1 epoch"
            + (", dry run" if options["dry_run"] else "")
            + "; dashboard = experiment_launch to a Celery worker, bare = the same command"
        )
        home = Path(settings.VAR_DIR)
        results: list[Launch] = []
        with redis_running(home=home), worker_running(home=home, dry_run=options["dry_run"]):
            for number in range(1, options["rounds"] + 1):
                self.stdout.write(HEADER)
                for strategy in STRATEGIES:
                    results += self._round_pair(number, strategy, owner=owner, options=options)
                    self.stdout.write(row(results[-2]))
                    self.stdout.write(row(results[-1]))
        queued_left_none()
        self._summary(results)

    def _round_pair(
        self, number: int, strategy: str, *, owner: Any, options: dict[str, Any]
    ) -> list[Launch]:
        fields = {
            "name": f"bench_launch {strategy} {number}",
            "strategy": strategy,
            "processes": STRATEGIES[strategy],
            "dataset": "mnist",
            "epochs": 1,
        }
        dashboard = dashboard_launch(number, owner=owner, fields=fields, timeout=options["timeout"])
        bare = bare_start(number, owner=owner, fields=fields, options=options)
        return [dashboard, bare]

    def _summary(self, results: list[Launch]) -> None:
        for strategy in STRATEGIES:
            for side in ("dashboard", "bare"):
                times = [
                    r.first_point_s for r in results if (r.strategy, r.side) == (strategy, side)
                ]
                self.stdout.write(
                    f"{strategy} {side}: first point {min(times):.2f}-{max(times):.2f} s "
                    f"(median {statistics.median(times):.2f})"
                )
        medians = {
            side: statistics.median(r.first_point_s for r in results if r.side == side)
            for side in ("dashboard", "bare")
        }
        self.stdout.write(
            f"median seconds to first point: dashboard {medians['dashboard']:.2f}, "
            f"bare {medians['bare']:.2f}"
        )
        self.stdout.write(f"launch ratio: {medians['dashboard'] / medians['bare']:.2f}")


HEADER = f"{'round':>5}  {'strategy':<8}  {'side':<9}  {'first point s':>13}  {'running s':>9}"


def row(launch: Launch) -> str:
    running = "-" if launch.running_s is None else f"{launch.running_s:.2f}"
    return (
        f"{launch.round:>5}  {launch.strategy:<8}  {launch.side:<9}  "
        f"{launch.first_point_s:>13.2f}  {running:>9}"
    )


# ---- the dashboard's side -----------------------------------------------------------------


def dashboard_launch(number: int, *, owner: Any, fields: dict[str, Any], timeout: float) -> Launch:
    """Launch through the service; poll for the run's status and first point, then its end."""
    from dashboard.experiments.models import ACTIVE_STATUSES, Experiment, SeriesPoint, Status
    from dashboard.experiments.services import experiment_launch

    started = time.monotonic()
    # limits=False: see the module docstring (the launches-a-minute limit).
    run = experiment_launch(owner=owner, fields=fields, limits=False)
    running_s = first_point_s = None
    deadline = started + timeout
    while time.monotonic() < deadline:
        status = Experiment.objects.values_list("status", flat=True).get(pk=run.pk)
        now = time.monotonic() - started
        if running_s is None and status != Status.QUEUED:
            running_s = now
        points = SeriesPoint.objects.filter(experiment_id=run.pk, key=FIRST_POINT_KEY)
        if first_point_s is None and points.exists():
            first_point_s = now
        if status not in ACTIVE_STATUSES:
            break
        time.sleep(POLL_SECONDS)
    run.refresh_from_db()
    if run.status != Status.SUCCEEDED or first_point_s is None:
        raise CommandError(
            f"the dashboard's {fields['strategy']} run ended {run.status}: {run.error}"
        )
    return Launch(number, fields["strategy"], "dashboard", first_point_s, running_s)


def worker_main(*, dry_run: bool) -> None:
    """The Celery worker as the Procfile starts it, in this process. The dashboard has no dry-run
    field: --dry-run adds the flag to the command its supervisor builds, in this worker only, so
    that both sides run the same short command."""
    from dashboard.celery import app
    from dashboard.experiments.runs import runner

    if dry_run:
        build = runner.training_command

        def dry(*, experiment: Any) -> list[str]:
            return [*build(experiment=experiment), "--dry-run"]

        runner.training_command = dry  # before the pool forks: its children inherit it
    app.worker_main(
        ["worker", "--loglevel", "WARNING", "--concurrency", WORKER_CONCURRENCY,
         "-n", "bench-launch@%h", "--without-gossip", "--without-mingle"]
    )  # fmt: skip


@contextmanager
def redis_running(*, home: Path) -> Iterator[None]:
    """The throwaway Redis on REDIS_URL's port (throwaway_rerun picked it): broker and layer."""
    port = int(urlsplit(settings.REDIS_URL).port or 6379)
    with process_running(
        redis_command(port=port),
        env=dict(os.environ),
        log=home / "redis.log",
        port=port,
        what="redis",
    ):
        yield


@contextmanager
def worker_running(*, home: Path, dry_run: bool) -> Iterator[None]:
    """`manage.py bench_launch --worker` until it answers a ping; terminated on the way out."""
    from dashboard.celery import app

    command = [sys.executable, str(ROOT / "manage.py"), "bench_launch", "--worker"]
    command += ["--dry-run"] if dry_run else []
    log = home / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(  # noqa: S603 - our own command line
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(
            lambda: worker.poll() is not None or app.control.ping(timeout=0.5),
            timeout=120,
            what="the Celery worker",
        )
        if worker.poll() is not None:
            raise CommandError(f"the worker exited {worker.returncode}:\n{log.read_text()[-3000:]}")
        yield
    finally:
        worker.terminate()  # Celery's warm shutdown: no run is left in flight here
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def queued_left_none() -> None:
    """Nothing this benchmark made may wait in the queue: a later launch would wait behind it."""
    from dashboard.experiments.models import Experiment, Status

    left = list(Experiment.objects.filter(status=Status.QUEUED).values_list("pk", flat=True))
    if left:
        raise CommandError(f"runs left queued: {left}")


# ---- the bare side ----------------------------------------------------------------------------


def bare_start(
    number: int, *, owner: Any, fields: dict[str, Any], options: dict[str, Any]
) -> Launch:
    """The supervisor's command line and environment, from Popen to the first step event."""
    from dashboard.devices.facts import machine_name
    from dashboard.experiments.models import Experiment
    from dashboard.experiments.runs import runner
    from training.protocol import parse_event

    # Never saved, so never in the queue: it lends its fields to the command line. Its id names
    # the run's folders, apart from every dashboard run's (whose ids are numbers).
    experiment = Experiment(owner=owner, worker=machine_name(), **fields)
    experiment.pk = f"bare-{fields['strategy']}-{number}"
    command = runner.training_command(experiment=experiment)
    command += ["--dry-run"] if options["dry_run"] else []
    env = {
        k: v
        for k, v in runner.training_environment(experiment=experiment).items()
        if not k.startswith("TRAINYARD_SUPERVISOR_")
    }
    stderr = Path(settings.TRAINYARD_RUNS_DIR) / f"{experiment.pk}.stderr"
    stderr.parent.mkdir(parents=True, exist_ok=True)
    first_step_s = None
    with stderr.open("w") as err:
        started = time.monotonic()
        process = subprocess.Popen(  # noqa: S603 - the dashboard's own command line
            command, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env,
            cwd=settings.BASE_DIR, text=True,
            # As the supervisor starts it (a session is a unit of CPU share under autogroup).
            start_new_session=True,
        )  # fmt: skip
        assert process.stdout is not None
        for line in process.stdout:  # read to the end, so the pipe never fills
            event = parse_event(line)
            if first_step_s is None and event is not None and event["type"] == "step":
                first_step_s = time.monotonic() - started
        returncode = process.wait(options["timeout"])
    if returncode != 0 or first_step_s is None:
        raise CommandError(
            f"bare {fields['strategy']} exited {returncode}:\n{stderr.read_text()[-2000:]}"
        )
    return Launch(number, fields["strategy"], "bare", first_step_s)
