"""The set-up's parallel pip install (.ci/pip_parallel.py): what it installs, and how it splits."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "pip_parallel.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pip_parallel", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(name: str, version: str, info: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": name, "version": version}, "download_info": info}


def test_the_report_gives_each_wheel_its_size_and_pin_but_not_the_project(tmp_path: Path) -> None:
    pip_parallel = _script()
    wheel = tmp_path / "torch-2.14.1+cpu-cp311-none-any.whl"
    wheel.write_bytes(b"x" * 5000)
    url = f"file://{wheel}".replace("+", "%2B")  # as pip's report writes a local file's URL
    report = {"install": [
        _item("trainyard", "0.1", {"url": f"file://{tmp_path}", "dir_info": {"editable": True}}),
        _item("torch", "2.14.1", {"url": url, "archive_info": {}}),
        _item("django", "5.2.19", {"url": "https://files.example/django.whl", "archive_info": {}}),
    ]}  # fmt: skip
    assert pip_parallel.wheels(report) == [
        (5000, "torch==2.14.1"),
        (pip_parallel.UNKNOWN_SIZE, "django==5.2.19"),
    ]


def test_the_wheels_are_dealt_into_parts_of_about_equal_bytes() -> None:
    pip_parallel = _script()
    found = [(554, "torch"), (553, "cudnn"), (423, "cublas"), (248, "triton"), (216, "nccl"),
             (214, "cufft"), (201, "cusolver"), (1, "six"), (1, "idna")]  # fmt: skip
    parts = pip_parallel.parts_dealt(found, 2)
    sizes = dict((spec, size) for size, spec in found)
    totals = sorted(sum(sizes[spec] for spec in part) for part in parts)
    assert sorted(spec for part in parts for spec in part) == sorted(sizes)
    assert totals == [1192, 1219]  # of 2,411: each within 1.2% of half
    # One pip per core, never an empty one, and one part where there is one core.
    assert pip_parallel.parts_dealt(found[:1], 4) == [["torch"]]
    assert pip_parallel.parts_dealt(found, 1) == [[spec for _, spec in sorted(found, reverse=True)]]


def test_a_failing_part_fails_the_install_after_every_part_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pip_parallel = _script()
    ended = tmp_path / "ended"
    # Each "pip" reads its part's listing (its last argument): the one holding "bad" exits 1.
    code = (f"import sys, pathlib; open({str(ended)!r}, 'a').write('x'); "
            "sys.exit('bad' in pathlib.Path(sys.argv[-1]).read_text())")  # fmt: skip
    monkeypatch.setattr(pip_parallel, "pip", lambda *args: [sys.executable, "-c", code, args[-1]])
    pip_parallel.parts_install([["good==1"], ["good==2"]], tmp_path)
    with pytest.raises(SystemExit, match="1 of 2 installs failed"):
        pip_parallel.parts_install([["good==1"], ["bad==1"]], tmp_path)
    assert ended.read_text() == "xxxx"


def test_the_parts_wheels_lose_the_requested_mark_others_keep_it(tmp_path: Path) -> None:
    pip_parallel = _script()
    for name in ("torch", "trainyard"):
        info = tmp_path / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "REQUESTED").write_text("")
        (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/REQUESTED,,\n")
    assert pip_parallel.installed_names([str(tmp_path)]) == {"torch", "trainyard"}
    pip_parallel.requested_unmark({"torch"}, [str(tmp_path)])
    assert not (tmp_path / "torch-1.0.dist-info" / "REQUESTED").exists()
    assert (tmp_path / "trainyard-1.0.dist-info" / "REQUESTED").exists()


def test_upgrades_go_first_and_alone_then_the_new_wheels_side_by_side() -> None:
    pip_parallel = _script()
    # A fresh venv holds its own setuptools, which the resolved set upgrades.
    found = [(554, "torch==2.14.1"), (553, "nvidia-cudnn-cu13==9.24"), (1, "setuptools==84.2.1"),
             (1, "Django==5.2.19")]  # fmt: skip
    plan = pip_parallel.install_plan(found, {"pip", "setuptools"}, 2)
    assert plan == [[["setuptools==84.2.1"]],
                    [["torch==2.14.1"], ["nvidia-cudnn-cu13==9.24", "Django==5.2.19"]]]  # fmt: skip
    # Nothing installed yet, or everything: one phase each.
    assert len(pip_parallel.install_plan(found, set(), 2)) == 1
    everything = {"torch", "nvidia-cudnn-cu13", "setuptools", "django"}
    in_one = [spec for _, spec in sorted(found, reverse=True)]
    assert pip_parallel.install_plan(found, everything, 2) == [[in_one]]
