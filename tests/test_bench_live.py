"""`manage.py bench_live --dry-run`: both paths reach every viewer and the ratio is printed last
(the format and the counts, never the times)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_bench_charts import NUMBER, bench_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_bench_live_dry_run_prints_both_paths_and_the_ratio(tmp_path: Path) -> None:
    out = bench_run("bench_live", tmp_path)
    lines = out.strip().splitlines()
    assert re.fullmatch(rf"live ratio: {NUMBER}", lines[-1]), out
    rows = {row.split()[0]: row.split() for row in lines if re.match(r"(trainer|bare)\s", row)}
    assert set(rows) == {"trainer", "bare"}, out
    for path, (_, sent, received, p50, p99) in rows.items():
        # Every event reached both viewers: 2 viewers x the events sent.
        assert int(received) == 2 * int(sent), (path, out)
        assert re.fullmatch(NUMBER, p50) and re.fullmatch(NUMBER, p99), out
