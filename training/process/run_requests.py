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

import signal
from types import FrameType

# A profile request's words, read by the training (training.observe.profiling) and written by
# whoever asks (the dashboard's supervisor, or a person at a shell): in the --profile-dir, this file
# holds {"profile": N, "steps": K}, K at most PROFILE_MAX_STEPS.
PROFILE_REQUEST_FILE = "request.json"
PROFILE_MAX_STEPS = 200

_checkpoint_requested = False
_profile_requested = False


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
