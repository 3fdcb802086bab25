"""``python -m training.bench lm``, tiny (the smoke size, two rounds of two steps, a table of
single and tensor parallel over 2 ranks): both sides print their tokens/s each round in the
alternating order, both loops trained the same model on the same windows (their held-out
losses agree), every strategy's row has its figures, and the ratio comes last. The figures
themselves are measured by running the command (docs/performance.md), not here. The table's
runs write a sample of 8 bytes, not 200 ($TRAINYARD_SAMPLE_BYTES), and the text is the Jargon
File's first 64 KiB, where the bench's data folder holds it (its held-out tail, which each
training's epoch evaluates whole, 6.5 KiB): the table reads none of the sample and only the
figures' presence of the evaluation, and under tensor parallel each byte and each window is a
round of collectives."""

from __future__ import annotations

import gzip
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_training import ROOT
from training.loop import SAMPLE_BYTES_ENV
from training.text_catalogue import JARGON_DEBIAN

# The Jargon File comes from Debian's jargon-text, which .ci/system-packages installs.
pytestmark = pytest.mark.usefixtures("no_processes_left")
NUMBER = r"\d+\.\d"


@pytest.mark.slow  # two loops in one process, then a single run and a 2-rank run
def test_lm_bench_prints_both_sides_each_round_and_its_ratio_last(tmp_path: Path) -> None:
    (tmp_path / "jargon.txt").write_bytes(gzip.decompress(JARGON_DEBIAN.read_bytes())[:65536])
    proc = subprocess.run(
        [sys.executable, "-m", "training.bench", "lm", "--model-size", "smoke", "--rounds", "2",
         "--steps", "2", "--table-steps", "3", "--strategies", "single,tensor-parallel"],
        cwd=ROOT, env={**os.environ, "TRAINYARD_DATA_DIR": str(tmp_path), SAMPLE_BYTES_ENV: "8"},
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    text = proc.stdout
    rounds = [re.fullmatch(rf"round (\d) (ours|bare) +({NUMBER}) tokens/s", line) for line in lines]
    said = [(m[1], m[2]) for m in rounds if m]
    # Both sides every round, the order alternating so that noise falls on both alike.
    assert said == [("1", "ours"), ("1", "bare"), ("2", "bare"), ("2", "ours")], text
    for side in ("ours", "bare"):
        assert re.search(rf"^{side} +{NUMBER} +{NUMBER}\d*% ", text, re.M), text
    assert re.search(r"^MFU against measured peak \(", text, re.M), text
    # Same initial weights, same windows, same rate, same clipping: the same model after.
    losses = re.search(r"^held-out loss after 6 steps: ours (\S+), bare (\S+)$", text, re.M)
    assert losses and float(losses[1]) == pytest.approx(float(losses[2]), abs=1e-3), text
    per_round = re.search(r"^ours / bare per round: (\S+), (\S+)$", text, re.M)
    assert per_round, text
    rows = {line.split()[0]: line.split() for line in lines if re.match(r"(single|tensor-)", line)}
    assert set(rows) == {"single", "tensor-parallel"}, text
    # single: 1 rank, the whole batch; tensor parallel: 2 ranks sharing it, each holding about
    # half of the state (the norms whole).
    assert rows["single"][1:3] == ["1", "16"] and rows["tensor-parallel"][1:3] == ["2", "16"]
    for row in rows.values():
        assert float(row[3]) > 0 and row[4].endswith("%") and 0 < float(row[7]) < 9, row
    single_state = _kib(rows["single"][8:10])
    halves = [_kib(rows["tensor-parallel"][i : i + 2]) for i in (8, 11)]
    assert rows["tensor-parallel"][10] == "/", text
    assert all(0.4 * single_state < half < 0.6 * single_state for half in halves), text
    assert re.fullmatch(r"lm ratio: \d+\.\d{3}", lines[-1]), text
    ratios = [float(per_round[1]), float(per_round[2])]
    assert float(lines[-1].split()[-1]) == pytest.approx(statistics.median(ratios), abs=2e-3)


def _kib(words: list[str]) -> float:
    """ "674.6", "KiB" as KiB."""
    value, unit = float(words[0]), words[1]
    return value * {"B": 1 / 1024, "KiB": 1, "MiB": 1024}[unit]
