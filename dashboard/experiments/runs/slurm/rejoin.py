"""An event line of one node that srun cut in two around another node's line.

srun relays each task's output in pieces of its I/O buffer: a line longer than that (a profile's
`ready` event, with every rank's summary) comes as several pieces, and another task's line may
come between them. The supervisor then reads the event's head followed by that other line, then
the event's rest, and neither is an event. Rejoined here: an event's head is held until the next
line completes it, cut where the buffer cut it (a multiple of its size), and the line that came
between is passed on by itself. A line cut twice stays as it came (its event is lost, as before).
"""

from __future__ import annotations

import json

EVENT_START = '{"v": '  # how every event line of the protocol begins (training/protocol.py)
BUFFER_SIZES = (512, 1024, 2048, 4096, 8192)  # srun's (slurmstepd's) per release and setting
MAX_HELD = 1 << 20


class EventRejoin:
    def __init__(self) -> None:
        self.held = ""  # an event's head (and the line that came after it), awaiting its rest

    def take(self, line: str) -> list[str]:
        """The lines `line` completes, in order: none while an event's head waits for its rest."""
        if self.held:
            held, self.held = self.held, ""
            text = line.rstrip("\n")
            for cut in _cuts(held):
                if _event(held[:cut] + text):
                    return [held[cut:] + "\n", held[:cut] + text + "\n"]
            return [held + "\n", *self.take(line)]
        text = line.rstrip("\n")
        cut_once = text.startswith(EVENT_START) and len(text) < MAX_HELD and _cuts(text)
        if cut_once and not _event(text):
            self.held = text
            return []
        return [line]


def _cuts(held: str) -> list[int]:
    """Where a buffer of one of BUFFER_SIZES may have cut `held`, latest first."""
    return sorted({k for size in BUFFER_SIZES for k in range(size, len(held), size)}, reverse=True)


def _event(text: str) -> bool:
    try:
        found = json.loads(text)
    except ValueError:
        return False
    return isinstance(found, dict) and isinstance(found.get("type"), str)
