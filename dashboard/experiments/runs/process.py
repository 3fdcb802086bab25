"""The training process: started as a new interpreter in a session of its own, its two output
streams read by threads into one queue, ended on request.

Celery's prefork children are daemonic and may not have multiprocessing children: a new
interpreter may. Nothing here knows what the lines mean (relay.py does).
"""

from __future__ import annotations

import queue
import subprocess
import threading
from pathlib import Path
from subprocess import Popen

from dashboard.experiments.runs.processes import (
    parent_death_signal_set,
    process_in_tree_signal,
    process_tree_stop,
)
from training.process.tree import OutputLine, output_lines_forward


def training_process_start(
    *, command: list[str], env: dict[str, str], cwd: Path | str
) -> TrainingProcess:
    return TrainingProcess(training_popen(command=command, env=env, cwd=cwd))


def training_popen(
    *, command: list[str], env: dict[str, str], cwd: Path | str, errors: str | None = None
) -> Popen[str]:
    """The launcher as a child of this process, its two streams piped: a TrainingProcess (or a
    kind of one, runs/slurm/step.py) reads them, once; `errors` as open()'s, for their text."""
    return subprocess.Popen(  # noqa: S603 - the command is built from validated fields
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors=errors,
        bufsize=1,
        start_new_session=True,
        preexec_fn=parent_death_signal_set,  # noqa: PLW1509 - only prctl, no locks taken
        cwd=cwd,
        env=env,
    )


class TrainingProcess:
    """A started launcher: its output lines from one queue, its tree ended on request."""

    def __init__(self, popen: Popen[str]):
        self.popen = popen
        self.pid = popen.pid
        self.lines: queue.Queue[OutputLine] = queue.Queue()
        for stream, source in ((popen.stdout, "stdout"), (popen.stderr, "stderr")):
            if stream is not None:  # a stream not piped has no lines to read
                threading.Thread(
                    target=output_lines_forward, args=(stream, source, self.lines), daemon=True
                ).start()

    def line_next(self, timeout: float) -> OutputLine:
        """The next line of output, ("", "") when none came within `timeout` seconds."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return "", ""

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self) -> int:
        return self.popen.wait()

    def stop(self, *, rank_pids: list[int], grace_seconds: float) -> list[int]:
        """SIGTERM the launcher's tree, wait, then SIGKILL what is left and every rank PID (ranks
        live in sessions of their own); returns the PIDs killed."""
        return process_tree_stop(
            root_pid=self.pid, extra_pids=rank_pids, grace_seconds=grace_seconds
        )

    def signal_in_tree(self, *, pid: int, signum: int) -> bool:
        """Signal `pid` if it is in this process's tree; False when it is not (it ended)."""
        return process_in_tree_signal(root_pid=self.pid, pid=pid, signum=signum)
