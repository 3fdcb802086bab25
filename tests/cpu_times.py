"""Where a pass's CPU goes: per test, the CPU time of the test's process and of every process
under it (the stack's servers, the trainings they start, the subprocesses a test runs), and how
busy the machine's cores were over the run.

A pass on two cores is bound by the CPU its trainings take (tests/file_order.py's line says how
busy the cores were): a test that waits long costs the other worker nothing, a test that trains
costs it its cores. Its wall time (pytest's --durations) does not tell the two apart; this does.

Each test's figure is taken from its set-up's start to its tear-down's end: the worker process's
own time and its children's, the live descendants' own and theirs (a process that ended and was
waited for is counted in its parent's children's time). A process orphaned before it is waited
for is missed, and one that was there at the start and is orphaned meanwhile (a killed server's
training) takes its time so far out of the test's figure; a session's servers count where they
work, in whichever test is running.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psutil
import pytest

KEY = "cpu_seconds"


def tree_cpu_seconds() -> float:
    me = psutil.Process()
    try:
        family = [me, *me.children(recursive=True)]
    except psutil.Error:  # /proc hidden (hidepid): this process alone
        family = [me]
    total = 0.0
    for process in family:
        try:
            t = process.cpu_times()
        except psutil.Error:  # ended meanwhile: its parent's children's time has it, or will
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """Registered in every process that runs tests (each xdist worker, or pytest alone)."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        self.started[item.nodeid] = tree_cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield
        # Before the tear-down's report is made, which carries the item's user properties.
        started = self.started.pop(item.nodeid, None)
        if started is not None:
            item.user_properties.append((KEY, max(tree_cpu_seconds() - started, 0.0)))


def reported_cpu(report: pytest.TestReport) -> float | None:
    return next((float(v) for k, v in report.user_properties if k == KEY), None)


def cpu_lines(per_test: dict[str, float], count: int = 25, minimum: float = 1.0) -> list[str]:
    """The sum, then the ``count`` tests that took the most, of those over ``minimum`` s."""
    if not per_test:
        return []
    total = sum(per_test.values())
    lines = [f"CPU of each test's processes: {total:.0f} s in all; the {count} that took most:"]
    for nodeid, seconds in sorted(per_test.items(), key=lambda kv: -kv[1])[:count]:
        if seconds >= minimum:
            lines.append(f"{seconds:8.1f} s  {nodeid}")
    return lines


def cpu_line(before: Any, after: Any) -> str:
    """How busy the machine's cores were over the run (every process, not only the tests'): near
    100% a pass is bound by the CPU its trainings take, and only less work shortens it; well
    below, by its waits (heartbeats, start-ups), which more workers would overlap."""
    # Linux counts guest time in user time as well: left out, so nothing is counted twice.
    fields = [name for name in after._fields if not name.startswith("guest")]
    spent = {name: getattr(after, name) - getattr(before, name) for name in fields}
    total = sum(spent.values())
    idle = spent["idle"] + spent.get("iowait", 0.0)
    share = 100 * (1 - idle / total) if total > 0 else 0.0
    cores = psutil.cpu_count() or 1
    return f"the machine's {cores} cores were busy {share:.0f}% of the run ({total - idle:.0f} s)"
