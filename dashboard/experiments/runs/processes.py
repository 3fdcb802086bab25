"""Ending a run's whole process tree: the launcher (torchrun) and every rank it started."""

from __future__ import annotations

import logging
import os
import signal
import time

import psutil

# One home for the prctl, in training/ (the dashboard may import training; never the reverse).
from training.process.lifeline import parent_death_signal_set as parent_death_signal_set

log = logging.getLogger(__name__)


def process_tree_collect(*, root_pid: int, extra_pids: list[int]) -> list[psutil.Process]:
    """The root, its descendants and any recorded rank PIDs that are still alive."""
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(root_pid)
        found[root.pid] = root
        for child in root.children(recursive=True):
            found[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    for pid in extra_pids:
        if pid in found or pid == os.getpid():
            continue
        try:
            found[pid] = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def process_tree_stop(*, root_pid: int, extra_pids: list[int], grace_seconds: float) -> list[int]:
    """SIGTERM everything, wait, SIGKILL what is left. Returns the PIDs that had to be killed.

    torchrun starts each rank in a session of its own, so a signal to torchrun's process group
    does not reach the ranks, and SIGKILL to torchrun alone would orphan them: every process is
    signalled by PID (PITFALLS: torchrun and DDP).
    """
    processes = process_tree_collect(root_pid=root_pid, extra_pids=extra_pids)
    for process in processes:
        _send(process, signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=grace_seconds)
    # Ranks may have started children (data workers) after the first look.
    late = process_tree_collect(root_pid=root_pid, extra_pids=[p.pid for p in alive])
    for process in late:
        _send(process, signal.SIGKILL)
    psutil.wait_procs(late, timeout=5)
    return [p.pid for p in late]


def _send(process: psutil.Process, sig: signal.Signals) -> None:
    try:
        process.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
        log.debug("could not signal %s: %s", process.pid, exc)


def process_wait_gone(*, pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and not _is_zombie(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def process_in_tree_signal(*, root_pid: int, pid: int, signum: int) -> bool:
    """Signal ``pid`` only if it is ``root_pid`` or one of its descendants: a PID the training
    reported may have ended and been reused by an unrelated process. Returns whether it was."""
    try:
        root = psutil.Process(root_pid)
        family = {root.pid, *(child.pid for child in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return False
    if pid not in family:
        return False
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True
