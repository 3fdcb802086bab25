"""Starting ``python -m training`` from a benchmark, as the dashboard does: one home for the
command line and the environment that the memory and parity benchmarks share."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout this package lives in


def training_command(strategy: str, flags: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "training", "--strategy", strategy, *flags]


def training_env(**extra: str) -> dict[str, str]:
    """This process's environment, plus: no dataset downloads (the data is prepared before a
    benchmark measures), this checkout importable wherever the command runs, and ``extra``."""
    env = dict(os.environ, TRAINYARD_NO_DOWNLOAD="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env
