"""A rank's events to the launcher that started it: protocol events (training/protocol.py, the
wire's one home) plus the rank and its own `seq`, one JSON object per line appended to
`rank-<r>.jsonl` in the folder TRAINYARD_EVENTS_DIR names.

A file per rank, not a pipe or a socket: appending never blocks the training whatever the reader
does, nothing is lost when the reader is slow, and the launcher on each machine reads its own
ranks' files. The script's stdout and stderr stay its logs (never read for events).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import IO, Any

from training.protocol import envelope


def number_or_none(value: Any) -> float | None:
    """A figure as JSON can carry it: a float, or None where it was not finite (JSON has no
    NaN). Refuses what is not a number, a 0-d tensor or a NumPy scalar (`item()`)."""
    if isinstance(value, bool):
        raise TypeError("a figure must be a number, not a bool")
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (int, float)):
        value = item()
    if not isinstance(value, (int, float)):
        raise TypeError(f"a figure must be a number, got {type(value).__name__}")
    number = float(value)
    return number if math.isfinite(number) else None


class EventChannel:
    """Appends this rank's events to its file; flushed per event (a crash loses none written)."""

    def __init__(
        self, folder: str | os.PathLike[str], *, rank: int, run_id: str, file: str | None = None
    ):
        """`file`: the file's name in `folder` (default rank-<rank>.jsonl; the launcher's
        observer writes its own, training/scripts/observer.py)."""
        self.path = Path(folder) / (file or f"rank-{rank}.jsonl")
        self.rank = rank
        self.run_id = run_id
        self.seq = 0
        self.t0 = time.monotonic()
        self.stream: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def send(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Write one event; returns it as written."""
        self.seq += 1
        head = envelope(run_id=self.run_id, seq=self.seq, type_=type_, t0=self.t0)
        event = head | {"rank": self.rank, **fields}
        if self.stream is not None:
            self.stream.write(json.dumps(event, allow_nan=False) + "\n")
            self.stream.flush()
        return event

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
