"""Longest test files first, so that two xdist workers end together.

`make test` hands pytest-xdist whole files (`--dist loadfile`). Left to itself, xdist queues the
files with the most tests first (`--loadscope-reorder`), which puts a file of six ten-minute
tests (two machines, tests/test_machines.py) last: one worker ran it alone for the last eight
minutes of a pass. Longest-processing-time-first is the classic fix for this kind of schedule,
so the suite orders its files by their measured seconds (tests/durations.json, written by
`pytest --store-durations`; only their ratios matter, so figures taken on a loaded machine
serve) and the Makefile turns xdist's reorder off (`--no-loadscope-reorder`).
A file not measured yet is estimated from the kinds of its tests (tests/kinds.py's marks): a
wrong figure only costs balance, never a result.

The same plugin prints, after each run, the files that took longest, each worker's busy time, how
busy the cores were and the tests that took the most CPU (tests/cpu_times.py), so that the next
imbalance, or the next test that hogs the cores, is seen without rerunning anything.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cpu_times import cpu_line, cpu_lines, reported_cpu

DURATIONS = Path(__file__).with_name("durations.json")
# The last run's CPU seconds of every test, past the 25 printed (cpu-<database>.json): where
# the next cut is found.
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
# Seconds a test of each kind takes on an idle 2-core machine, roughly (a stack test is mostly
# waiting for processes, a machines test for two clusters' heartbeats); a test of several kinds
# counts its largest. Only the order of files not yet measured rests on these.
ESTIMATES = {"machines": 90.0, "slow": 60.0, "stack": 20.0, "integration": 20.0, "browser": 5.0}
QUICK = 0.3


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _estimate(item: pytest.Item) -> float:
    kinds = [seconds for kind, seconds in ESTIMATES.items() if item.get_closest_marker(kind)]
    return max(kinds, default=QUICK)


def durations_load(database: str) -> dict[str, float]:
    try:
        stored = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    measured = stored.get(database, {}) if isinstance(stored, dict) else {}
    return {str(k): float(v) for k, v in measured.items() if isinstance(v, int | float)}


def files_longest_first(items: list[pytest.Item], measured: dict[str, float]) -> None:
    """Reorders ``items`` in place: files by their seconds, longest first; within a file, and
    between files of equal weight, the collection's own order (every xdist worker collects the
    same list, so each sorts it the same way)."""
    estimated: dict[str, float] = defaultdict(float)
    for item in items:
        estimated[_file(item.nodeid)] += _estimate(item)
    weight = {name: measured.get(name, guess) for name, guess in estimated.items()}
    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-weight[_file(item.nodeid)], position[id(item)]))


class FileTimes:
    """Sums each file's and each worker's seconds (set-up, call and tear-down of every test) as
    the reports come in: in the controller under xdist, in the one process otherwise."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.files: dict[str, float] = defaultdict(float)
        self.workers: dict[str, float] = defaultdict(float)
        self.cpu_before = psutil.cpu_times()
        self.cpu: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        worker = getattr(getattr(report, "node", None), "gateway", None)
        self.files[_file(report.nodeid)] += report.duration
        self.workers[getattr(worker, "id", "main")] += report.duration
        cpu = reported_cpu(report)
        if cpu is not None:
            self.cpu[report.nodeid] = cpu

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.files:
            return
        write = terminalreporter.write_line
        terminalreporter.section("slowest files (their tests' set-up, call and tear-down)")
        for name, seconds in sorted(self.files.items(), key=lambda kv: -kv[1])[:12]:
            write(f"{seconds:8.1f} s  {name}")
        busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(self.workers.items()))
        write(f"busy time per worker: {busy}")
        write(cpu_line(self.cpu_before, psutil.cpu_times()))
        for line in cpu_lines(self.cpu):
            write(line)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.config.getoption("store_durations") and self.files:
            self._durations_store()
        if self.cpu:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            ranked = dict(sorted(self.cpu.items(), key=lambda kv: -kv[1]))
            database = self.config.getoption("database")
            (ARTIFACTS / f"cpu-{database}.json").write_text(json.dumps(ranked, indent=1) + "\n")

    def _durations_store(self) -> None:
        try:
            stored = json.loads(DURATIONS.read_text())
        except (OSError, ValueError):
            stored = {}
        database = str(self.config.getoption("database"))
        merged = {**stored.get(database, {}), **{k: round(v, 1) for k, v in self.files.items()}}
        stored[database] = dict(sorted(merged.items()))
        DURATIONS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
