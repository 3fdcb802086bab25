"""The engine's own torchrun runs watched for stalls (issue 33 item 3) with a script run's record
and watch: each rank keeps its progress record (progress.py) fed by the step loop (a step each
step, evaluation's forwards) and c10d's pre-hook (every collective entered: progress_hooks.py),
and the watch (stall.py) reads the records once a second and writes the same ``stalled`` event.

The records' folder is made by the CLI before it becomes torchrun (PROGRESS_ENV, one per machine)
and removed by the CLI of the machine's first rank when it ends.

Where the watch runs: in a thread of rank 0. A script run's launcher is a process of ours above
torchrun and reads its ranks from outside; an engine run has none (the CLI execs torchrun, so
that the PID the worker holds is torchrun's), and its events are rank 0's to write: its stdout is
the run's event stream. A thread there goes on while rank 0's own loop waits in a collective
(c10d's wait releases the GIL) or is busy, so it names a hung rank 1 as the launcher would; what
no thread of rank 0 can say is rank 0 itself frozen (stopped, or stuck in C holding the GIL).
A paused watch (its whole process stopped, as a suspended run's) does not take the pause for the
ranks' stall. Only the first machine's ranks are watched, as for scripts: the others keep no
record. The cost: one Python call per collective (the pre-hook; no post hook), one per step and
one per evaluation batch.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from training.observe.progress import PROGRESS_ENV, STACK_SIGNAL
from training.observe.progress_hooks import ProgressHooks
from training.observe.stall import CHECK_SECONDS, STACK_WAIT_SECONDS, StallWatch, stall_floor
from training.process.runtime import Runtime
from training.protocol import EventWriter

log = logging.getLogger("training")

ENDED = "a rank's training ended"  # why a record is no longer judged, in the stall's end
# Between two checks of a watch that runs: a second, or a stall's stacks taken (seconds).
PAUSED_SECONDS = 4 * CHECK_SECONDS + 2 * STACK_WAIT_SECONDS


class StallThread:
    """Rank 0's watch over its machine's records, in a daemon thread: the stall and its end
    written as ``stalled`` events, none once closed (the run ends or is stopped)."""

    def __init__(self, folder: Path, events: EventWriter, *, floor: float):
        self.watch = StallWatch(folder, floor=floor, unwatched=ENDED)
        self.events = events
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trainyard-stall", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self.closed.wait(CHECK_SECONDS):
            if time.monotonic() - last > PAUSED_SECONDS:
                self.watch.paused(time.time())
            try:
                fields = self.watch.check(time.time())
            except Exception as error:  # noqa: BLE001 - the watch fails open: training goes on
                log.warning("the stall watch stopped: %s: %s", type(error).__name__, error)
                return
            if fields is not None and not self.closed.is_set():
                self.events.emit("stalled", **fields)
            last = time.monotonic()

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=CHECK_SECONDS + STACK_WAIT_SECONDS + 1)


class RankWatch:
    """This rank's side: its record, fed by the loop and c10d's pre-hook; on rank 0 the watch."""

    def __init__(self, folder: Path, rt: Runtime, events: EventWriter, floor: float):
        self.hooks = ProgressHooks(folder, rt.rank)
        self.hooks.groups_hook()  # the collectives before the first step are seen too
        self.forward_hooks: list[Any] = []
        self.thread = StallThread(folder, events, floor=floor) if rt.is_main else None

    def stepped(self, step: int) -> None:
        self.hooks.stepped(step)

    def forwards_seen(self, net: nn.Module) -> None:
        """Each call of ``net`` is a move: evaluation makes no step, yet is no stall."""

        def forwarded(module: nn.Module, args: Any) -> None:
            self.hooks.forwarded()

        self.forward_hooks.append(net.register_forward_pre_hook(forwarded))

    def close(self) -> None:
        """The watch first (a rank that ends is no stall to tell), then this rank's hooks."""
        if self.thread is not None:
            self.thread.close()
        for handle in self.forward_hooks:
            handle.remove()
        self.hooks.remove()
        faulthandler.unregister(STACK_SIGNAL)  # before its file closes: no dump into another
        # Unregistered, the signal's default action would end the process: a watch that read
        # this rank as stalled an instant before must not kill a rank that is done.
        signal.signal(STACK_SIGNAL, signal.SIG_IGN)
        self.hooks.writer.stacks.close()


def rank_watch(
    rt: Runtime, events: EventWriter, environ: Mapping[str, str] = os.environ
) -> RankWatch | None:
    """This rank's part of the watch, where the CLI made the records' folder (a torchrun run it
    launched) and on the first machine; none where the record cannot be made (said once: the
    run trains, its stalls unseen)."""
    folder = environ.get(PROGRESS_ENV, "")
    if not (rt.distributed and folder):
        return None
    if rt.rank != rt.local_rank:  # another machine's: no record read there
        return None
    try:
        return RankWatch(Path(folder), rt, events, stall_floor(environ))
    except Exception as error:  # noqa: BLE001 - c10d's hooks are new API: the run trains on
        log.warning("no stall watch on this rank: %s: %s", type(error).__name__, error)
        return None


@contextlib.contextmanager
def rank_watched(rt: Runtime, events: EventWriter) -> Iterator[RankWatch | None]:
    """``rank_watch`` for the length of a training, closed however it ends."""
    watch = rank_watch(rt, events)
    try:
        yield watch
    finally:
        if watch is not None:
            watch.close()
