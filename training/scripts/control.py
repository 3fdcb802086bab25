"""What the launcher asks of a script's ranks: a Stop, and checkpoints (a count of requests),
in one small JSON file the trainyard library reads at its agreement calls; and the latest
profile request, which the observer reads at its windows (profiles.py).

Replaced whole (written aside, then renamed), so that a rank reads the old request or the new
one, never half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

# Where a script's ranks write their profiles: the launcher's --profile-dir, given to the ranks
# only where they can record them.
PROFILE_DIR_ENV = "TRAINYARD_PROFILE_DIR"


@dataclass
class Requests:
    stop: bool = False
    checkpoint: int = 0  # requests made so far: a rank compares it with those it answered
    profile: int = 0  # the latest profile request's number (the dashboard's row), 0: none
    profile_steps: int = 0


def requests_write(*, path: Path, requests: Requests) -> None:
    aside = path.with_name(path.name + ".new")
    aside.write_text(json.dumps(asdict(requests)), encoding="utf-8")
    os.replace(aside, path)


def profiles_refusal(*, profile_dir: str | None, env: Mapping[str, str]) -> str:
    """Why a script run's ranks cannot record profiles ("" where they can): the observer records
    them, and TRAINYARD_OBSERVE=0 leaves it out (rank.py)."""
    if profile_dir is None:
        return "its launcher was started without --profile-dir"
    if env.get("TRAINYARD_OBSERVE", "1") == "0":
        return "its observer, which records them, is off (TRAINYARD_OBSERVE=0 on its worker)"
    return ""
