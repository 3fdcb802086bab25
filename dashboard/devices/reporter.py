"""Workers write what they know about their machine into the database, every few seconds."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from dashboard.devices.facts import machine_facts_collect, worker_address
from dashboard.devices.models import WorkerMachine
from dashboard.devices.signals import machine_joined

logger = logging.getLogger(__name__)


def machine_report_save(*, facts: dict[str, Any], joined: bool = False) -> WorkerMachine:
    """Upsert by hostname: a restarted worker takes over its machine's row. A report that brings
    the machine online (its first, one after a silence, or `joined`: this worker's first) sends
    machine_joined."""
    before = WorkerMachine.objects.filter(hostname=facts["hostname"]).first()
    machine, _ = WorkerMachine.objects.update_or_create(
        hostname=facts["hostname"],
        defaults={"report": facts, "reported_at": timezone.now(), "address": worker_address()},
    )
    if joined or before is None or not before.is_online:
        machine_joined.send_robust(sender=WorkerMachine, hostname=machine.hostname)
    return machine


def machine_report_once(*, joined: bool = False) -> WorkerMachine | None:
    """Collect and save one report; failures are logged, never raised, so the loop lives on."""
    try:
        return machine_report_save(facts=machine_facts_collect(), joined=joined)
    except Exception:
        logger.exception("device report failed; trying again at the next interval")
        return None
    finally:
        # This thread outlives any request cycle, so nothing else closes its connection; a
        # connection left open would also hold SQLite's WAL snapshot back.
        connection.close()


class MachineReporter:
    """A daemon thread that reports at once and then every `interval` seconds until stopped."""

    def __init__(self, *, interval: float | None = None) -> None:
        self.interval = float(
            interval if interval is not None else settings.TRAINYARD_DEVICE_REPORT_SECONDS
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="trainyard-device-reporter", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        logger.info("device reporter started, every %s s", self.interval)
        joined = True  # this worker's first report: runs may wait for its machine
        while not self._stop.is_set():
            machine_report_once(joined=joined)
            joined = False
            # wait() instead of sleep() so that a shutdown does not wait out the interval.
            self._stop.wait(self.interval)
        logger.info("device reporter stopped")


_reporter: MachineReporter | None = None
_reporter_lock = threading.Lock()


def reporter_start(*, interval: float | None = None) -> MachineReporter:
    """Start the process's one reporter (idempotent: a second worker_ready does not double it)."""
    global _reporter
    with _reporter_lock:
        if _reporter is None or not _reporter.is_alive():
            _reporter = MachineReporter(interval=interval)
            _reporter.start()
        return _reporter


def reporter_stop() -> None:
    global _reporter
    with _reporter_lock:
        if _reporter is not None:
            _reporter.stop()
            _reporter = None
