"""What supervising a run through the dashboard costs the training, in images/s.

`python manage.py bench_overhead` runs one config alternately (A B A B ...):

A  the dashboard's supervisor path, `run_experiment`: claim the row, start the training as a new
   interpreter, read its events, store them in the database in batches and send every flush to
   the run's channel group on a real Redis, where a listener drains them as a browser's socket
   would;
B  the same `python -m training` command line and environment alone, its events written to a file
   (the run's row, made for its command line, is deleted before it starts: it never waits in the
   queue).

Images/s are the mean of each run's step events (its epoch events after a --dry-run), so start-up
and tear-down do not count. The last line is `overhead ratio: X` (A / B; target >= 0.98).

By default everything happens in a child process on a temporary SQLite file and runs folder, so the
user's database is never touched (--use-configured-db benchmarks against the configured one and
deletes its rows afterwards). Redis is the one REDIS_URL names when it answers, else one started on
a free port with the binary `serve_redis` would use.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.management.commands.serve_redis import redis_binary, redis_listening
from training.registry import MULTIPROCESS_STRATEGIES, strategy_get

CHILD_ENV = "TRAINYARD_BENCH_OVERHEAD_CHILD"
MODES = ("dashboard", "plain")


@dataclass(frozen=True)
class Measurement:
    round: int
    mode: str
    images_per_second: float
    events: int
    wall_seconds: float
    messages: int | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_url_resolve(*, stderr: Any) -> tuple[str, subprocess.Popen[bytes] | None]:
    """REDIS_URL when something answers there, else a throwaway Redis on a free local port."""
    url = urlparse(settings.REDIS_URL)
    if redis_listening(host=url.hostname or "127.0.0.1", port=url.port or 6379):
        return settings.REDIS_URL, None
    port = free_port()
    binary = redis_binary()
    stderr.write(f"REDIS_URL does not answer; starting {binary} on port {port}\n")
    process = subprocess.Popen(  # noqa: S603 - a fixed binary and numbers
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while not redis_listening(host="127.0.0.1", port=port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise CommandError(f"{binary} did not start on port {port}")
        time.sleep(0.1)
    return f"redis://127.0.0.1:{port}/0", process


class GroupDrain(threading.Thread):
    """Reads a run's channel group like the ASGI server's consumer, so sends really deliver."""

    def __init__(self, group: str):
        super().__init__(daemon=True)
        self.group = group
        self.messages = 0
        self.ready = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        asyncio.run(self._drain())

    async def _drain(self) -> None:
        from channels.layers import channel_layers

        layer = channel_layers.make_backend("default")  # its own instance, on this loop
        channel = await layer.new_channel()
        await layer.group_add(self.group, channel)
        self.ready.set()
        while not self.done.is_set():
            try:
                await asyncio.wait_for(layer.receive(channel), timeout=0.2)
                self.messages += 1
            except TimeoutError:
                continue
        await layer.group_discard(self.group, channel)


def events_images_per_second(events: list[dict[str, Any]]) -> float | None:
    """Mean images/s of the step events, or of the epoch events when there is no step event."""
    for kind in ("step", "epoch"):
        values = [
            float(e["images_per_second"])
            for e in events
            if e.get("type") == kind and isinstance(e.get("images_per_second"), int | float)
        ]
        if values:
            return statistics.fmean(values)
    return None


# ---- the measurements, one function a mode ------------------------------------------------------


def dashboard_measure(*, number: int, experiment: Any, worker: str) -> Measurement:
    from dashboard.experiments.models import SeriesPoint, Status
    from dashboard.experiments.runs.broadcast import experiment_group
    from dashboard.experiments.tasks import run_experiment

    drain = GroupDrain(experiment_group(experiment.pk))
    drain.start()
    drain.ready.wait(10)
    started = time.monotonic()
    try:
        # The task's own body, in this process (worker: this machine's name, as the task's).
        status = run_experiment(experiment_id=experiment.pk)
    finally:
        drain.done.set()
        drain.join(5)
    wall = time.monotonic() - started
    experiment.refresh_from_db()
    if status != Status.SUCCEEDED:
        reason = experiment.error or f"not settled by {worker}"
        raise CommandError(f"the dashboard run ended {status or 'unsettled'}: {reason}")
    # The step events' images/s and the epochs' (their own series): what was stored.
    keys = {"images_per_second": "step", "epoch/images_per_second": "epoch"}
    points = SeriesPoint.objects.filter(experiment=experiment, key__in=keys).order_by("id")
    events = [{"type": keys[p.key], "images_per_second": p.value} for p in points]
    return measurement_make(
        number=number, mode="dashboard", events=events, wall=wall, messages=drain.messages
    )


def plain_measure(*, number: int, experiment: Any, timeout: float) -> Measurement:
    from dashboard.experiments.runs import runner
    from training.protocol import parse_event

    command = runner.training_command(experiment=experiment)
    # The same command line and environment the supervisor uses, nobody reading along.
    env = {
        k: v
        for k, v in runner.training_environment(experiment=experiment).items()
        if not k.startswith("TRAINYARD_SUPERVISOR_")
    }
    out_dir = Path(settings.TRAINYARD_RUNS_DIR) / f"plain-{experiment.pk}"
    # The row only lent its id and fields to the command line. Left queued, it would hold
    # the next round's dashboard run behind it (the queue's turn rule); its id is never
    # given out again (AUTOINCREMENT, sequences), so no later run shares its folders.
    experiment.delete()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (out_dir / "stdout").open("w") as out, (out_dir / "stderr").open("w") as err:
        result = subprocess.run(  # noqa: S603 - the dashboard's own command line
            command,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=settings.BASE_DIR,
            timeout=timeout,
            check=False,
            # As the supervisor starts it: with autogroup scheduling a session is a unit of
            # CPU share, so a difference here would be measured as overhead.
            start_new_session=True,
        )
    wall = time.monotonic() - started
    events: list[dict[str, Any]] = [
        dict(event)
        for line in (out_dir / "stdout").read_text().splitlines()
        if (event := parse_event(line)) is not None
    ]
    if result.returncode != 0 or not any(e["type"] == "finished" for e in events):
        tail = (out_dir / "stderr").read_text()[-2000:]
        raise CommandError(f"plain training exited {result.returncode}:\n{tail}")
    return measurement_make(number=number, mode="plain", events=events, wall=wall, messages=None)


def measurement_make(
    *, number: int, mode: str, events: list[dict[str, Any]], wall: float, messages: int | None
) -> Measurement:
    ips = events_images_per_second(events)
    if ips is None:
        raise CommandError(f"the {mode} run reported no images/s")
    counted = [e for e in events if e.get("type") in {"step", "epoch"}]
    return Measurement(number, mode, ips, len(counted), wall, messages)


# ---- output -------------------------------------------------------------------------------------

HEADER = f"{'round':>5}  {'mode':<9}  {'images/s':>10}  {'events':>6}  {'wall s':>7}  messages"


def measurement_row(m: Measurement) -> str:
    messages = "-" if m.messages is None else str(m.messages)
    return (
        f"{m.round:>5}  {m.mode:<9}  {m.images_per_second:>10.1f}  {m.events:>6}  "
        f"{m.wall_seconds:>7.1f}  {messages}"
    )


class Command(BaseCommand):
    help = (
        "Training images/s through the dashboard's supervisor (events, database, channel layer) "
        "versus plain `python -m training`, alternating; the last line is `overhead ratio: X`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        from dashboard.experiments.models import Dataset, Strategy

        parser.add_argument("--strategy", choices=Strategy.values, default="ddp")
        parser.add_argument(
            "--processes", type=int, default=2, help=f"for {', '.join(MULTIPROCESS_STRATEGIES)}"
        )
        parser.add_argument("--dataset", choices=Dataset.values, default="mnist")
        parser.add_argument("--epochs", type=int, default=1)
        parser.add_argument("--batch-size", type=int, default=64)
        parser.add_argument("--rounds", type=int, default=2, help="A B pairs (default: 2)")
        parser.add_argument(
            "--dry-run", action="store_true", help="one batch per epoch: checks the path only"
        )
        parser.add_argument(
            "--use-configured-db",
            action="store_true",
            help="use the configured database (its bench rows are deleted afterwards) instead "
            "of a temporary SQLite file",
        )
        parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
        parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rounds"] < 1:
            raise CommandError("--rounds must be at least 1")
        if options["child"] or os.environ.get(CHILD_ENV):
            self._bench(options)
            return
        self._spawn(options)

    # ---- parent: a temporary database, runs folder and Redis for the child ----------------

    def _spawn(self, options: dict[str, Any]) -> None:
        redis_url, redis_process = redis_url_resolve(stderr=self.stderr)
        try:
            with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
                env = {
                    **os.environ,
                    CHILD_ENV: "1",
                    "REDIS_URL": redis_url,
                    "TRAINYARD_RUNS_DIR": str(Path(tmp) / "runs"),
                    "TRAINYARD_DATA_DIR": str(settings.TRAINYARD_DATA_DIR),
                }
                if not options["use_configured_db"]:
                    env["DATABASE_URL"] = f"sqlite:///{Path(tmp) / 'bench.sqlite3'}"
                argv = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
                argv += ["bench_overhead", "--child", *self._passed_options(options)]
                self.stdout.flush()
                result = subprocess.run(argv, env=env, check=False)  # noqa: S603
                if result.returncode:
                    raise CommandError(f"the benchmark failed (exit {result.returncode})")
        finally:
            if redis_process is not None:
                redis_process.terminate()
                redis_process.wait(10)

    @staticmethod
    def _passed_options(options: dict[str, Any]) -> list[str]:
        argv = [
            f"--strategy={options['strategy']}",
            f"--processes={options['processes']}",
            f"--dataset={options['dataset']}",
            f"--epochs={options['epochs']}",
            f"--batch-size={options['batch_size']}",
            f"--rounds={options['rounds']}",
            f"--timeout={options['timeout']}",
        ]
        if options["dry_run"]:
            argv.append("--dry-run")
        if options["use_configured_db"]:
            argv.append("--use-configured-db")
        return argv

    # ---- child: the measurements ----------------------------------------------------------

    def _bench(self, options: dict[str, Any]) -> None:
        from django.contrib.auth import get_user_model

        from dashboard.devices.facts import machine_name

        if not options["use_configured_db"]:
            call_command("migrate", verbosity=0, interactive=False)
        user = get_user_model().objects.create_user(
            username=f"bench-overhead-{secrets.token_hex(4)}", is_active=False
        )
        worker = machine_name()
        self.stdout.write(
            f"bench_overhead: {options['strategy']}"
            + (f" x{options['processes']}" if strategy_get(options["strategy"]).processes else "")
            + f", {options['dataset']}, {options['epochs']} epoch(s), batch {options['batch_size']}"
            + (", dry run" if options["dry_run"] else "")
            + f"; A = dashboard supervisor (DB + channel layer at {settings.REDIS_URL}), "
            "B = python -m training alone"
        )
        if options["dry_run"]:
            self._dry_run_everywhere()
        self.stdout.write(HEADER)
        results: list[Measurement] = []
        try:
            for number in range(1, options["rounds"] + 1):
                for mode in MODES:
                    experiment = self._experiment_make(user=user, worker=worker, options=options)
                    if mode == "dashboard":
                        measured = dashboard_measure(
                            number=number, experiment=experiment, worker=worker
                        )
                    else:
                        measured = plain_measure(
                            number=number, experiment=experiment, timeout=options["timeout"]
                        )
                    results.append(measured)
                    self.stdout.write(measurement_row(measured))
        finally:
            if options["use_configured_db"]:
                user.delete()  # and, by cascade, its bench experiments
        self._summary(results)

    @staticmethod
    def _dry_run_everywhere() -> None:
        """The dashboard has no dry-run field: add the flag to the command its supervisor builds
        in this benchmark process only, so that both modes run the same short command."""
        from dashboard.experiments.runs import runner

        build = runner.training_command

        def dry(*, experiment: Any) -> list[str]:
            return [*build(experiment=experiment), "--dry-run"]

        runner.training_command = dry

    def _experiment_make(self, *, user: Any, worker: str, options: dict[str, Any]) -> Any:
        from dashboard.experiments.models import Experiment, ZeroStage

        strategy = options["strategy"]
        return Experiment.objects.create(
            owner=user,
            name="bench_overhead",
            strategy=strategy,
            processes=options["processes"] if strategy_get(strategy).processes else 1,
            zero_stage=ZeroStage.ONE if strategy == "deepspeed" else None,
            dataset=options["dataset"],
            epochs=options["epochs"],
            batch_size=options["batch_size"],
            worker=worker,
        )

    def _summary(self, results: list[Measurement]) -> None:
        means = {
            mode: statistics.fmean(m.images_per_second for m in results if m.mode == mode)
            for mode in MODES
        }
        self.stdout.write(
            f"mean images/s: dashboard {means['dashboard']:.1f}, plain {means['plain']:.1f}"
        )
        self.stdout.write(f"overhead ratio: {means['dashboard'] / means['plain']:.3f}")
