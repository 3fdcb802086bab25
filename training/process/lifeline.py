"""Tying a child process's life to its parent's: one home for ``PR_SET_PDEATHSIG``.

Used by Hogwild's processes (training/strategies/hogwild/) and by the dashboard's runner for
the training process it starts (as ``preexec_fn``). No torch here: the web side imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# Resolved once, at import: in a ``preexec_fn`` (after fork, before exec) the child should only
# call prctl, not open libraries.
_libc: ctypes.CDLL | None = None
with contextlib.suppress(OSError):
    _libc = ctypes.CDLL(None, use_errno=True)


def parent_death_signal_set() -> None:
    """SIGTERM this process when the process that started it dies, even by SIGKILL.

    A Celery pool child killed outright (SIGKILL, OOM) would otherwise leave its training
    running with nobody reading its events, and a Hogwild parent its processes. Linux only;
    elsewhere a no-op. The parent may already be gone when this runs: a caller that must not
    outlive it checks ``os.getppid()`` afterwards.
    """
    with contextlib.suppress(AttributeError):  # no prctl: not Linux
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
