"""Functions run in bounded children by tests/test_bounded.py: module-level, so that they travel
by pickle."""

from __future__ import annotations

import os
import time

from dashboard.experiments.core.archives import ImportRefused

GIB = 1024**3


def echo_env(name: str) -> str | None:
    return os.environ.get(name)


def allocate(total: int) -> int:
    """Holds `total` bytes in 64 MiB blocks, as a reader filling a declared shape would."""
    blocks = [bytearray(64 * 1024 * 1024) for _ in range(total // (64 * 1024 * 1024))]
    return len(blocks)


def wait(seconds: float) -> float:
    """A reader that takes its time without computing (a child that holds its slot)."""
    time.sleep(seconds)
    return seconds


def spin() -> None:
    while True:
        pass


def refuse() -> None:
    raise ImportRefused(400, "series name '' is empty")


def fail() -> None:
    raise ValueError("a reader's own error")


def crash() -> None:
    os._exit(3)
