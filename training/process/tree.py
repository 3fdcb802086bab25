"""Ending a whole process tree, and reading a child's output lines: one home for the engine's
script launcher (training/scripts/) and the dashboard's runner (dashboard/experiments/runs/),
which both start a launcher whose ranks live in sessions of their own. No torch here: the web
side imports it.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
from typing import IO

import psutil

log = logging.getLogger(__name__)

# A line of output: (its stream's name, the line; None once that stream closed).
OutputLine = tuple[str, str | None]


def output_lines_forward(stream: IO[str], source: str, lines: queue.Queue[OutputLine]) -> None:
    """Put each line of `stream` on `lines`, then None once it closed (a thread per stream)."""
    for line in stream:
        lines.put((source, line))
    lines.put((source, None))


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
