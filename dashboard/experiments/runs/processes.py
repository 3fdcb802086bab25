"""Ending a run's whole process tree: the launcher (torchrun) and every rank it started."""

from __future__ import annotations

import logging
import os
import time

import psutil

# One home for the prctl and for ending a tree, in training/ (the dashboard may import training;
# never the reverse): the engine's script launcher ends its torchrun the same way.
from training.process.lifeline import parent_death_signal_set as parent_death_signal_set
from training.process.tree import process_tree_collect as process_tree_collect
from training.process.tree import process_tree_stop as process_tree_stop

log = logging.getLogger(__name__)


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
