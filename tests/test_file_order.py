"""The files' order under xdist (tests/file_order.py): longest first, measured or estimated."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import file_order
from tests.file_order import durations_load, files_longest_first


@dataclass
class Item:
    """What the ordering reads of a collected test: its id and its kinds' marks."""

    nodeid: str
    kinds: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.kinds else None


def ids(items: list[Item]) -> list[str]:
    return [item.nodeid for item in items]


def test_a_file_of_few_long_tests_goes_before_a_file_of_many_quick_ones() -> None:
    quick = [Item(f"tests/test_api.py::test_{n}") for n in range(40)]
    machines = [Item(f"tests/test_machines.py::test_{n}", {"machines", "integration"})
                for n in range(3)]  # fmt: skip
    browser = [Item("tests/test_pages.py::test_0", {"browser"})]
    items = quick + browser + machines
    files_longest_first(items, measured={})  # type: ignore[arg-type]
    assert ids(items) == ids(machines) + ids(quick) + ids(browser)


def test_measured_seconds_win_over_the_estimate_and_a_files_order_is_kept() -> None:
    first = [Item("tests/test_a.py::test_2"), Item("tests/test_a.py::test_1")]
    second = [Item("tests/test_b.py::test_0", {"stack"})]
    items = second + first
    files_longest_first(items, measured={"tests/test_a.py": 300.0})  # type: ignore[arg-type]
    assert ids(items) == ids(first) + ids(second)


def test_durations_are_read_per_database_and_a_broken_file_is_no_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = tmp_path / "durations.json"
    monkeypatch.setattr(file_order, "DURATIONS", stored)
    assert durations_load("sqlite") == {}
    stored.write_text(json.dumps({"sqlite": {"tests/test_a.py": 12.5, "bad": "x"},
                                  "postgres": {"tests/test_a.py": 3}}))  # fmt: skip
    assert durations_load("sqlite") == {"tests/test_a.py": 12.5}
    assert durations_load("postgres") == {"tests/test_a.py": 3.0}
    stored.write_text("{not json")
    assert durations_load("sqlite") == {}


class Options:
    def __init__(self, **options: object) -> None:
        self.options = options

    def getoption(self, name: str) -> object:
        return self.options[name]


def report(nodeid: str, duration: float) -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("f", 1, "t"), {}, "passed", None, "call", duration=duration)


def test_store_durations_sums_each_files_phases_and_keeps_the_other_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = tmp_path / "durations.json"
    stored.write_text(json.dumps({"sqlite": {"tests/test_old.py": 7.0, "tests/test_a.py": 1.0}}))
    monkeypatch.setattr(file_order, "DURATIONS", stored)
    times = file_order.FileTimes(Options(store_durations=True, database="sqlite"))  # type: ignore[arg-type]
    for nodeid, seconds in [("tests/test_a.py::t1", 2.0), ("tests/test_a.py::t2", 0.25),
                            ("tests/test_b.py::t1", 4.0)]:  # fmt: skip
        times.pytest_runtest_logreport(report(nodeid, seconds))
    times.pytest_sessionfinish(None)  # type: ignore[arg-type]
    assert json.loads(stored.read_text()) == {"sqlite": {
        "tests/test_a.py": 2.2, "tests/test_b.py": 4.0, "tests/test_old.py": 7.0}}  # fmt: skip
    assert times.workers == {"main": 6.25}


def test_every_tests_cpu_is_kept_most_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_order, "ARTIFACTS", tmp_path / "art")
    times = file_order.FileTimes(Options(store_durations=False, database="postgres"))  # type: ignore[arg-type]
    times.cpu.update({"tests/test_a.py::t1": 0.5, "tests/test_b.py::t1": 30.0})
    times.pytest_sessionfinish(None)  # type: ignore[arg-type]
    kept = (tmp_path / "art" / "cpu-postgres.json").read_text()
    assert list(json.loads(kept).items()) == [
        ("tests/test_b.py::t1", 30.0),
        ("tests/test_a.py::t1", 0.5),
    ]
