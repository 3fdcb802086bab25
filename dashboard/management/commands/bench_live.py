"""How long a run's event takes from the trainer to the browsers watching it, beside the bare
Channels path, both under a training-like load on every core.

`python manage.py bench_live`, in a throwaway home (database, runs folder, Redis; see
dashboard/serving.py), starts daphne with the Procfile's flags, LOAD_PROCESSES CPU-burning
processes (a training keeps both cores busy) and VIEWERS WebSocket viewers of one run's page
socket (/ws/experiments/<id>/, in a process of their own). Then, at --rate events a second
(default 4: a training's step event comes every 10 steps, a few a second on this machine; a
higher rate measures the sink's coalescing under load instead):

bare     `group_send` from sync code to the run's group (what the sink does, with nothing
         before it): half of the sends before the trainer runs, half after, so a drift of the
         machine's load falls on both paths;
trainer  the dashboard's whole path: the run is supervised by `run_experiment` (as a Celery
         worker does), whose training command is a small trainer that writes step events on
         stdout; the supervisor reads them, stores them and sends them through the channel
         layer to daphne's consumer, which sends them to every viewer.

Every event carries the wall-clock time it was written (`bench_sent_at`; one machine, one clock)
and each viewer notes when it arrived. Printed: p50 and p99 per path in milliseconds over every
(event, viewer) pair, and last `live ratio: X` (trainer p99 / bare p99; goal <= 2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from dashboard.management.throwaway import ThrowawayBenchCommand
from dashboard.serving import servers_running, session_cookie

VIEWERS, DRY_VIEWERS = 20, 2
EVENTS, DRY_EVENTS = 100, 6  # per path
RATE = 4.0  # events a second
LOAD_PROCESSES = 2
GOAL_RATIO = 2.0

# The trainer: protocol events on stdout as `python -m training` writes them (EventWriter), each
# step stamped with the wall-clock time it was written. argv: steps, seconds between steps.
TRAINER = """
import os, sys, time
from training.protocol import EventWriter
steps, gap = int(sys.argv[1]), float(sys.argv[2])
writer = EventWriter("bench-live")
writer.emit("started", strategy="single", world_size=1, device="cpu", devices=["cpu"],
    dataset="mnist", dataset_source="bench_live: no data", train_size=steps, test_size=0,
    epochs=1, start_epoch=1, batch_size=1, global_batch_size=1, steps_per_epoch=steps,
    total_steps=steps, optimizer="adam", lr=0.001, seed=1, dry_run=False, torch_version="-",
    pids=[os.getpid()], launcher_pid=os.getpid(), notes=[])
for step in range(1, steps + 1):
    time.sleep(gap)
    writer.emit("step", epoch=1, step=step, train_loss=1.0, images_per_second=1.0,
        bench_path="trainer", bench_sent_at=time.time())
writer.emit("finished", test_loss=None, test_accuracy=0.0, epochs=1, epochs_run=1,
    steps=steps, duration=0.0)
"""


@dataclass(frozen=True)
class Received:
    path: str  # "trainer" or "bare"
    latency_ms: float


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: the value below which `fraction` of them lie."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def burn(stop: EventType) -> None:
    """One core's worth of training-like load, until told to stop."""
    total = 0
    while not stop.is_set():
        for i in range(100_000):
            total += i * i


def viewers_main(url: str, cookie: str, count: int, out: str, ready: EventType, stop: Any) -> None:
    """`count` WebSocket viewers of one run; what arrived with a stamp goes to `out` (JSON)."""
    asyncio.run(_viewers(url, cookie, count, Path(out), ready, stop))


async def _viewers(
    url: str, cookie: str, count: int, out: Path, ready: EventType, stop: EventType
) -> None:
    from websockets.asyncio.client import connect

    origin = url.replace("ws://", "http://").split("/ws/")[0]
    headers = {"Cookie": f"sessionid={cookie}", "Origin": origin}
    sockets = [await connect(url, additional_headers=headers, max_size=None) for _ in range(count)]
    for ws in sockets:
        await ws.recv()  # the snapshot
    ready.set()
    received: list[list[Any]] = []

    async def read(ws: Any) -> None:
        while not stop.is_set():
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=0.2)
            except TimeoutError:
                continue
            arrived = time.time()
            message = json.loads(raw)
            if "bench_sent_at" in message:
                received.append(
                    [message["bench_path"], (arrived - message["bench_sent_at"]) * 1000]
                )

    await asyncio.gather(*(read(ws) for ws in sockets))
    for ws in sockets:
        await ws.close()
    out.write_text(json.dumps(received))


class Command(ThrowawayBenchCommand):
    help = (
        "p50/p99 milliseconds from a trainer writing an event to 20 WebSocket viewers receiving "
        "it, beside bare group_send, under a 2-process CPU load; last line `live ratio: X`."
    )

    bench_name = "bench_live"
    dry_run_help = f"{DRY_VIEWERS} viewers, a few events"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--events", type=int, default=EVENTS, help="per path (default 100)")
        parser.add_argument("--rate", type=float, default=RATE, help="events a second (4)")

    def child_options(self, options: dict[str, Any]) -> list[str]:
        rate = f"--rate={options['rate']}"
        return [*super().child_options(options), f"--events={options['events']}", rate]

    def bench(self, *, owner: Any, options: dict[str, Any]) -> None:
        dry_run, rate = options["dry_run"], options["rate"]
        if options["events"] < 2 or not 0 < rate <= 1000:
            raise CommandError("--events must be at least 2 and --rate in (0, 1000]")
        from dashboard.devices.facts import machine_name
        from dashboard.experiments.models import Experiment

        worker = machine_name()
        run = Experiment.objects.create(
            owner=owner, name="bench_live", strategy="single", processes=1, worker=worker
        )
        viewers, events = (DRY_VIEWERS, DRY_EVENTS) if dry_run else (VIEWERS, options["events"])
        self.stdout.write(
            f"bench_live: {viewers} viewers of one run's socket, {LOAD_PROCESSES} CPU-burning "
            f"processes, {events} events per path at {rate:g}/s"
            + (", dry run" if dry_run else "")
            + "; daphne with the Procfile's flags, a throwaway Redis"
        )
        home = Path(settings.VAR_DIR)
        with servers_running(home=home) as base_url, load_running(LOAD_PROCESSES):
            url = f"{base_url.replace('http://', 'ws://')}/ws/experiments/{run.pk}/"
            with viewers_running(url, session_cookie(owner), viewers, home) as results:
                self._bare_send(run.pk, events // 2, rate)
                self._trainer_run(run.pk, worker, events, rate)
                self._bare_send(run.pk, events - events // 2, rate)
                time.sleep(2)  # the last ones in flight
        self._print(results(), viewers=viewers, events=events)

    @staticmethod
    def _bare_send(pk: int, count: int, rate: float) -> None:
        """The bare Channels path: group_send from sync code, as the sink sends, at the same
        rate as the trainer's events."""
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        from dashboard.experiments.core.messages import GROUP_MESSAGE_TYPE
        from dashboard.experiments.runs.broadcast import experiment_group

        layer = get_channel_layer()
        assert layer is not None
        for number in range(count):
            time.sleep(1 / rate)
            event = {"type": "log", "seq": number, "message": "bare", "bench_path": "bare"}
            message = {
                "type": GROUP_MESSAGE_TYPE,
                "events": [{**event, "bench_sent_at": time.time()}],
            }
            async_to_sync(layer.group_send)(experiment_group(pk), message)

    @staticmethod
    def _trainer_run(pk: int, worker: str, events: int, rate: float) -> None:
        """The dashboard's path: the supervisor runs the stamping trainer as its training."""
        from dashboard.experiments.models import Status
        from dashboard.experiments.runs import runner
        from dashboard.experiments.tasks import run_experiment

        def trainer(*, experiment: Any) -> list[str]:
            return [sys.executable, "-c", TRAINER, str(events), str(1 / rate)]

        runner.training_command = trainer  # this benchmark process only
        # The supervisor logs the command line it starts (the whole script): not a figure.
        logging.getLogger(runner.__name__).setLevel(logging.WARNING)
        # The task's own body, in this process (worker: this machine's name, as the task's).
        status = run_experiment(experiment_id=pk)
        if status != Status.SUCCEEDED:
            raise CommandError(f"the trainer's run ended {status or 'unsettled'} on {worker}")

    def _print(self, received: list[Received], *, viewers: int, events: int) -> None:
        self.stdout.write(
            f"{'path':<8}  {'sent':>5}  {'received':>8}  {'p50 ms':>8}  {'p99 ms':>8}"
        )
        p99: dict[str, float] = {}
        for path in ("trainer", "bare"):
            latencies = [r.latency_ms for r in received if r.path == path]
            if not latencies:
                raise CommandError(f"no {path} event reached a viewer")
            p99[path] = percentile(latencies, 0.99)
            self.stdout.write(
                f"{path:<8}  {events:>5}  {len(latencies):>8}  "
                f"{statistics.median(latencies):>8.1f}  {p99[path]:>8.1f}"
            )
        self.stdout.write(
            f"expected per path: {events * viewers} (events x {viewers} viewers); "
            f"goal: trainer p99 <= {GOAL_RATIO:g}x bare p99"
        )
        self.stdout.write(f"live ratio: {p99['trainer'] / p99['bare']:.2f}")


@contextmanager
def load_running(processes: int) -> Iterator[None]:
    """`processes` CPU burners, as a training on every core would be."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    burners = [context.Process(target=burn, args=(stop,), daemon=True) for _ in range(processes)]
    for burner in burners:
        burner.start()
    try:
        yield
    finally:
        stop.set()
        for burner in burners:
            burner.join(10)


@contextmanager
def viewers_running(url: str, cookie: str, count: int, home: Path) -> Iterator[Any]:
    """The viewers in a process of their own (their reading must not wait on this one's GIL);
    yields a function that returns what they received, once they have stopped."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    out = home / "viewers.json"
    process = context.Process(target=viewers_main, args=(url, cookie, count, str(out), ready, stop))
    process.start()
    if not ready.wait(60):
        process.kill()
        raise CommandError("the viewers did not all get their snapshot within 60 s")

    def results() -> list[Received]:
        return [Received(path, latency) for path, latency in json.loads(out.read_text())]

    try:
        yield results
    finally:
        stop.set()
        process.join(30)
