"""The ranks' events, read by their launcher: each rank of a script run appends protocol events
(with its `rank` and own `seq`) to `rank-<r>.jsonl` in the events folder (the trainyard
library's trainyard/channel.py writes them); read here as they grow, whole lines only.

Besides the protocol's types, a rank says four things to its launcher alone: `hello` (its pid:
it runs the library), `listening` (it asks whether to stop, so a Stop waits for the ranks to
agree), `stopping` (it agreed to stop, at `step`) and `done` (its part ended, stopped or not).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RANK_FILE = re.compile(r"rank-(\d{1,6})\.jsonl")
# The observer's (observer.py, rank 0's alone): the windows of every rank's phases.
OBSERVER_FILE = re.compile(r"observer-(\d{1,6})\.jsonl")
# A line longer than this is not a rank's event (a broken writer): skipped, not buffered forever.
MAX_LINE_BYTES = 1024 * 1024


@dataclass
class RankFile:
    offset: int = 0
    partial: bytes = b""


@dataclass
class RankEvents:
    """The events folder, read from where each file was left."""

    folder: Path
    files: dict[int, RankFile] = field(default_factory=dict)
    names: re.Pattern[str] = RANK_FILE

    def read(self) -> list[dict[str, Any]]:
        """The events written since the last read, each rank's in its order."""
        events: list[dict[str, Any]] = []
        for path in sorted(self.folder.glob("*.jsonl")):
            matched = self.names.fullmatch(path.name)
            if matched is not None:
                events += self._read_one(path, self.files.setdefault(int(matched[1]), RankFile()))
        return events

    def _read_one(self, path: Path, state: RankFile) -> list[dict[str, Any]]:
        with open(path, "rb") as stream:
            stream.seek(state.offset)
            data = stream.read()
        state.offset += len(data)
        *lines, state.partial = (state.partial + data).split(b"\n")
        if len(state.partial) > MAX_LINE_BYTES:
            state.partial = b""
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("type"), str):
                events.append(event)
        return events
