"""A user's file is read in a child under a memory and CPU-time limit (issue 35, item 1's
"better": dashboard/experiments/core/bounded.py): what the child finds comes back, its
refusals come back as they were, and a child past its memory or its time is refused, the test
process (the web server's stand-in) never holding the memory."""

from __future__ import annotations

import resource
import threading
import time

import pytest

from dashboard.experiments.core import bounded
from dashboard.experiments.core.archives import ImportRefused
from dashboard.experiments.core.bounded import bounded_call
from dashboard.experiments.core.limits import LaunchLimited
from tests import bounded_targets as targets


def test_the_result_and_the_settings_of_the_call_travel(monkeypatch: pytest.MonkeyPatch) -> None:
    # Set after the fork server may have started: each call carries its TRAINYARD_ settings.
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_SERIES", "7")
    assert bounded_call(targets.echo_env, "TRAINYARD_IMPORT_MAX_SERIES") == "7"
    monkeypatch.delenv("TRAINYARD_IMPORT_MAX_SERIES")
    assert bounded_call(targets.echo_env, "TRAINYARD_IMPORT_MAX_SERIES") is None


def test_a_child_past_its_memory_is_refused_with_413(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_IMPORT_MEMORY_BYTES", str(256 * 1024 * 1024))
    ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert bounded_call(targets.allocate, 128 * 1024 * 1024) == 2  # within: the blocks' count
    with pytest.raises(ImportRefused) as refused:
        bounded_call(targets.allocate, 4 * targets.GIB)
    assert refused.value.status == 413
    assert refused.value.message == "reading the file needs more than 256 MiB"
    # The 4 GiB were asked of the child: this process grew by no more than noise.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - ours < 64 * 1024  # KiB


def test_a_child_past_its_cpu_time_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_IMPORT_CPU_SECONDS", "1")
    started = time.monotonic()
    with pytest.raises(ImportRefused) as refused:
        bounded_call(targets.spin)
    assert (refused.value.status, refused.value.message) == (400, "reading the file takes over 1 s")
    assert time.monotonic() - started < 10


def test_refusals_and_failures_come_back_as_refusals() -> None:
    with pytest.raises(ImportRefused) as refused:
        bounded_call(targets.refuse)
    assert (refused.value.status, refused.value.message) == (400, "series name '' is empty")
    with pytest.raises(ImportRefused) as failed:
        bounded_call(targets.fail)
    assert failed.value.status == 400
    assert failed.value.message == "the file could not be read (ValueError: a reader's own error)"
    with pytest.raises(ImportRefused) as died:
        bounded_call(targets.crash)
    assert died.value.message == "the file could not be read (its reader ended with exit code 3)"


def test_children_at_once_are_bounded_and_a_call_past_them_is_a_429(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each child may take its memory limit: a burst of imports at once (30 a user an hour pass
    # the rate limit) took 30 times it, the machine's memory, not the web server's bound.
    monkeypatch.setenv("TRAINYARD_IMPORT_CONCURRENCY", "1")
    monkeypatch.setattr(bounded, "SLOT_WAIT_SECONDS", 0.5)
    results: list[float] = []
    holder = threading.Thread(target=lambda: results.append(bounded_call(targets.wait, 4.0)))
    holder.start()
    try:
        deadline = time.monotonic() + 30
        while not bounded.bounded_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bounded.bounded_running() == 1
        with pytest.raises(LaunchLimited) as refused:
            bounded_call(targets.echo_env, "TRAINYARD_IMPORT_CONCURRENCY")
        assert refused.value.limit == "import_readers"
        assert 0 < refused.value.retry_after <= 4 + bounded.WALL_SLACK + 120
        assert "TRAINYARD_IMPORT_CONCURRENCY" in refused.value.message
    finally:
        holder.join()
    assert results == [4.0]
    # Its slot freed, the next call runs.
    assert bounded_call(targets.echo_env, "TRAINYARD_IMPORT_CONCURRENCY") == "1"
