"""A script rank's output as its log: torchrun tags each line with the rank that wrote it
(``--tee`` with the prefix ``[rank<r>]: ``); the launcher writes it on stderr as one of the
training's marked log lines (training/protocol.py), so a watcher keeps it with that rank and
its stream (level ``stdout`` or ``stderr``). torchrun's own lines pass as they are."""

from __future__ import annotations

import time

from training.protocol import LOG_LINE_MARKER, LOG_LINE_SEPARATOR
from training.protocol import RANK_OUTPUT_PREFIX as RANK_PREFIX


def rank_line(source: str, line: str) -> str:
    """The line as the launcher writes it on stderr (newline-terminated)."""
    found = RANK_PREFIX.match(line)
    if found is None:
        return line if line.endswith("\n") else line + "\n"
    text = line[found.end() :].rstrip("\n")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"{LOG_LINE_MARKER}{stamp} rank {found[1]} {source.upper()}{LOG_LINE_SEPARATOR}{text}\n"
