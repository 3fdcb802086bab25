"""Requests to a running training: SIGUSR1 asks for a checkpoint at the next step boundary.

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

_checkpoint_requested = False


def requests_install() -> None:
    """Take checkpoint requests from now on (SIGUSR1's default action would kill us)."""
    signal.signal(signal.SIGUSR1, _on_checkpoint_request)


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
