"""Requests to a running training: SIGUSR1 asks for a checkpoint at the next step boundary,
SIGUSR2 for a profile (what to record is in ``<--profile-dir>/request.json``: a signal carries no
arguments; ``training.observe.profiling`` reads it).

The ``started`` event names the process to signal (``requests_pid``): rank 0 under torchrun,
Hogwild's parent, else the run's only process. A signal, not a file or a socket, because it needs
nothing from the caller but the PID, works the same from the dashboard and from a shell
(``kill -USR1 <pid>``), and is what batch schedulers send before a job's time runs out. The
handler only sets a flag; the training loop takes it between steps, where the state is whole.

No torch here: the CLI installs the handler before it imports torch.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeGuard

# A profile request's words, read by the training (training.observe.profiling) and written by
# whoever asks (the dashboard's supervisor, or a person at a shell): in the --profile-dir, this file
# holds {"profile": N, "steps": K}, K at most PROFILE_MAX_STEPS.
PROFILE_REQUEST_FILE = "request.json"
PROFILE_MAX_STEPS = 200

_checkpoint_requested = False
_profile_requested = False


@dataclass(frozen=True)
class ProfileRequest:
    profile: int  # the request's number, echoed in its events (the dashboard's row)
    steps: int


def profile_request_read(profile_dir: Path) -> ProfileRequest | str:
    """The request in ``request.json``, or why it is not one (read by the engine's rank 0, and
    by a script run's launcher, which passes it on to its ranks)."""
    try:
        asked = json.loads((profile_dir / PROFILE_REQUEST_FILE).read_text())
    except (OSError, ValueError) as exc:
        return f"no readable {PROFILE_REQUEST_FILE} in {profile_dir}: {exc}"
    if not isinstance(asked, dict):
        return f"{PROFILE_REQUEST_FILE} must hold a JSON object, got {asked!r}"
    number, steps = asked.get("profile", 0), asked.get("steps")
    if not (_is_int(number) and _is_int(steps) and 1 <= steps <= PROFILE_MAX_STEPS and number >= 0):
        return (
            f"{PROFILE_REQUEST_FILE} must hold integers profile (>= 0) and steps "
            f"(1..{PROFILE_MAX_STEPS}), got {asked!r}"
        )
    return ProfileRequest(profile=number, steps=steps)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def requests_install() -> None:
    """Take checkpoint and profile requests from now on (SIGUSR1's and SIGUSR2's default action
    would kill us)."""
    signal.signal(signal.SIGUSR1, _on_checkpoint_request)
    signal.signal(signal.SIGUSR2, _on_profile_request)


def _on_profile_request(signum: int, frame: FrameType | None) -> None:
    global _profile_requested
    _profile_requested = True


def profile_request_take() -> bool:
    """Whether a profile was requested since the last take; clears the request."""
    global _profile_requested
    taken, _profile_requested = _profile_requested, False
    return taken


def _on_checkpoint_request(signum: int, frame: FrameType | None) -> None:
    global _checkpoint_requested
    _checkpoint_requested = True


def checkpoint_request_pending() -> bool:
    return _checkpoint_requested


def checkpoint_request_take() -> bool:
    """Whether a checkpoint was requested since the last take; clears the request."""
    global _checkpoint_requested
    taken, _checkpoint_requested = _checkpoint_requested, False
    return taken
