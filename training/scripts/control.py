"""What the launcher asks of a script's ranks: a Stop, and checkpoints (a count of requests),
in one small JSON file the trainyard library reads at its agreement calls.

Replaced whole (written aside, then renamed), so that a rank reads the old request or the new
one, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Requests:
    stop: bool = False
    checkpoint: int = 0  # requests made so far: a rank compares it with those it answered


def requests_write(*, path: Path, requests: Requests) -> None:
    aside = path.with_name(path.name + ".new")
    aside.write_text(json.dumps(asdict(requests)), encoding="utf-8")
    os.replace(aside, path)
