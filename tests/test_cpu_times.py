"""tests/cpu_times.py: each test's CPU, its processes' and theirs, and the cores' busy share."""

from __future__ import annotations

import subprocess
import sys
from collections import namedtuple
from types import SimpleNamespace

from tests.cpu_times import KEY, cpu_line, cpu_lines, tree_cpu_seconds
from tests.file_order import FileTimes

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"


def test_a_child_waited_for_counts_in_the_tree_and_a_live_grandchild_too() -> None:
    before = tree_cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    assert tree_cpu_seconds() - before >= 0.5
    # A grandchild that burnt its half second and lives on, waited for by nobody: only the live
    # tree has its time (its parent and this process spend a few hundredths, blocked on pipes).
    grandchild = BURN + "\nimport sys\nprint('burnt', flush=True)\nsys.stdin.read()"
    child = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}], stdin=subprocess.PIPE, "
        "stdout=subprocess.PIPE, text=True)\n"
        "print(p.stdout.readline(), end='', flush=True)\nsys.stdin.read()\np.communicate('')"
    )
    start = tree_cpu_seconds()
    parent = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "burnt\n"
        assert tree_cpu_seconds() - start >= 0.5
    finally:
        parent.communicate("")


def test_the_heaviest_tests_come_first_with_the_sum() -> None:
    lines = cpu_lines({"a": 1.0, "b": 30.25, "c": 2.0}, count=2)
    assert lines[0].startswith("CPU of each test's processes: 33 s in all; the 2 that took most")
    assert lines[1:] == ["    30.2 s  b", "     2.0 s  c"]
    assert cpu_lines({"a": 0.5, "b": 3.0})[1:] == ["     3.0 s  b"]  # under a second: left out
    assert cpu_lines({}) == []


def test_the_cpu_line_counts_every_core_and_no_guest_time_twice() -> None:
    """Two cores over 10 s: 20 s in all, 5 of them idle or waiting on the disk; the guest's 3 s
    are already in user time."""
    Times = namedtuple("Times", "user system idle iowait guest")  # psutil's fields on Linux
    before, after = Times(100, 50, 200, 10, 7), Times(112, 53, 203, 12, 10)
    line = cpu_line(before, after)
    assert line.endswith("busy 75% of the run (15 s)"), line
    assert cpu_line(before, before).endswith("busy 0% of the run (0 s)")


def test_the_tear_downs_report_carries_the_figure_to_the_controllers_table() -> None:
    """The controller's side: FileTimes reads the figure from the report's user properties (the
    worker's CpuMeter puts it there before the tear-down's report is made)."""
    times = FileTimes(SimpleNamespace())  # type: ignore[arg-type]
    for when, properties in (("call", []), ("teardown", [("other", 1), (KEY, 2.5)])):
        report = SimpleNamespace(nodeid="t.py::a", duration=1.0, when=when,
                                 user_properties=properties)  # fmt: skip
        times.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    assert times.cpu == {"t.py::a": 2.5} and times.files == {"t.py": 2.0}
