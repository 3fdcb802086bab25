"""Each rank's progress, for its launcher to tell a stalled run (issue 33 item 3): the rank's
observer keeps its steps, its last forward and the latest collective it entered (left when the
rank next moves) in ``progress-<rank>.bin`` in the events folder, one fixed record rewritten in
place through mmap (a memory write per collective, no system call); the launcher reads every
rank's record on its machine (stall.py).

A rank's Python stack is taken from outside its code: faulthandler, registered on STACK_SIGNAL,
writes every thread's stack to ``stack-<rank>.txt`` from its C signal handler, so a rank blocked
inside a collective's C++ wait still answers. A real-time signal: SIGUSR1 and SIGUSR2 are the
checkpoint's and the profile's, and a user's script may take them too.
"""

from __future__ import annotations

import faulthandler
import mmap
import os
import re
import shutil
import signal
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# The folder of an engine run's records on one machine, made by the CLI before it execs torchrun
# (a script run's are in its launcher's events folder).
PROGRESS_ENV = "TRAINYARD_PROGRESS_DIR"
# The records' folder of an engine run is made by the CLI, whose process then becomes torchrun
# (exec keeps its pid): the pid in its name tells a folder whose run is gone.
RECORDS_PREFIX = "trainyard-progress-"


def records_folder_make() -> str:
    """A new records' folder for this machine's ranks, named with this process's pid; the
    folders of runs whose process is gone are removed first (a run killed by SIGKILL, as
    torchrun's Stop of a rank hung in a collective ends it, never removed its own)."""
    for stale in Path(tempfile.gettempdir()).glob(f"{RECORDS_PREFIX}*-*"):
        pid = stale.name.removeprefix(RECORDS_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{RECORDS_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


PROGRESS_FILE = "progress-{rank}.bin"
PROGRESS_NAME = re.compile(r"progress-(\d{1,6})\.bin")
STACK_FILE = "stack-{rank}.txt"
STACK_SIGNAL = signal.SIGRTMIN + 3
# pid, watched (0 once the observer left: its steps no longer counted), step, Unix times of the
# last step and the last outermost forward, collectives entered, the latest one's op, the Unix
# times it was entered and left (0 while inside).
LAYOUT = struct.Struct("<qqqddq24sdd")


@dataclass(frozen=True)
class RankProgress:
    rank: int
    pid: int
    watched: bool
    step: int
    stepped_at: float  # 0: no step yet
    forward_at: float  # 0: no forward yet
    collectives: int  # entered so far; the latest is the collectives-th
    op: str
    entered_at: float
    left_at: float  # 0 while the rank is inside it

    @property
    def active_at(self) -> float:
        """When this rank last moved: a step, a forward (an evaluation loop makes no step but is
        no stall), a collective entered (a distributed checkpoint's) or left (a backward's
        end); a hung rank does none (one waiting in a collective has not moved since it
        entered it)."""
        return max(self.stepped_at, self.forward_at, self.entered_at, self.left_at)

    @property
    def inside(self) -> bool:
        return self.collectives > 0 and self.left_at == 0.0


class ProgressWriter:
    """This rank's record. Collectives may be entered on other threads than the script's
    (autograd's, where DDP's reducer runs on a GPU): a lock keeps each rewrite whole."""

    def __init__(self, folder: Path, rank: int):
        path = folder / PROGRESS_FILE.format(rank=rank)
        with open(path, "wb") as f:
            f.write(bytes(LAYOUT.size))
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, LAYOUT.size)
        finally:
            os.close(fd)
        self.lock = threading.Lock()
        self.values: list[int | float | bytes] = [os.getpid(), 1, 0, 0.0, 0.0, 0, b"", 0.0, 0.0]
        self.stacks: IO[str] = open(folder / STACK_FILE.format(rank=rank), "a")  # noqa: SIM115
        # faulthandler keeps the file's descriptor: it must stay open while the rank runs.
        faulthandler.register(STACK_SIGNAL, file=self.stacks, all_threads=True)
        self._write()

    def _write(self) -> None:
        LAYOUT.pack_into(self.map, 0, *self.values)

    def stepped(self, step: int) -> None:
        with self.lock:
            now = self.values[3] = time.time()
            self.values[2] = step
            self._moved(now)
            self._write()

    def forwarded(self) -> None:
        with self.lock:
            now = self.values[4] = time.time()
            self._moved(now)
            self._write()

    def moved(self) -> None:
        with self.lock:
            self._moved(time.time())
            self._write()

    def _moved(self, now: float) -> None:
        """A rank that moves on has left its collective."""
        if self.values[5] and self.values[8] == 0.0:
            self.values[8] = now

    def entered(self, op: str) -> None:
        """A collective entered (the one before it left: collectives are entered in order)."""
        with self.lock:
            self.values[5:9] = [int(self.values[5]) + 1, op.encode()[:24], time.time(), 0.0]
            self._write()

    def unwatched(self) -> None:
        """The observer left (it failed, or the ranks could not meet): no step is counted from
        now on, so no stall can be told from this rank's record."""
        with self.lock:
            self.values[1] = 0
            self._write()


def progress_read(folder: Path) -> list[RankProgress]:
    """Every rank's record in the folder, rank order (records not yet whole are skipped)."""
    found = []
    for path in folder.iterdir():
        name = PROGRESS_NAME.fullmatch(path.name)
        if name is None:
            continue
        data = path.read_bytes()
        if len(data) != LAYOUT.size:
            continue
        pid, watched, step, stepped, forward, seq, op, entered, left = LAYOUT.unpack(data)
        if pid <= 0:
            continue
        found.append(RankProgress(
            rank=int(name[1]), pid=pid, watched=bool(watched), step=step, stepped_at=stepped,
            forward_at=forward, collectives=seq, op=op.rstrip(b"\0").decode(errors="replace"),
            entered_at=entered, left_at=left,
        ))  # fmt: skip
    return sorted(found, key=lambda p: p.rank)
