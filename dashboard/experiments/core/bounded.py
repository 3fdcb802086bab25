"""A function of a user's file run in a child process under a memory and a CPU-time limit, never
in the web server's own: a reader that a crafted file fools (a tensor's declared shape, a
decompressor without a bound, a parser that loops) then fails alone, and daphne, which serves
every page and socket, keeps its memory (issue 35, item 1).

The child forks from multiprocessing's fork server, which has Django and the target's module
loaded once (dashboard/forkserver.py): a fork takes milliseconds where a fresh interpreter that
imports Django and TensorBoard takes a second and a half. The limit is on the child's address
space (RLIMIT_AS) above what it has mapped when it starts, so that the libraries' own mappings
do not count; past it an allocation fails (MemoryError) instead of the kernel's OOM killer
picking a process. The CPU limit (RLIMIT_CPU) ends a child that computes for too long
(SIGXCPU), and the wall-clock one a child that waits. The settings the target reads
(TRAINYARD_*) travel with each call: the fork server keeps the environment it started with.
Each child may take its memory limit, so a process runs at most TRAINYARD_IMPORT_CONCURRENCY at
once: a burst of imports (the hourly rate lets a user send 30 at once) waits for a turn, briefly,
and is then refused (429) rather than taking the machine's memory.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import resource
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from dashboard.env import env_int
from dashboard.experiments.core.archives import ImportRefused
from dashboard.experiments.core.limits import LaunchLimited

T = TypeVar("T")
MiB = 1024 * 1024
ENV_PREFIX = "TRAINYARD_"
# Wall-clock seconds on top of the CPU limit: a child that waits on nothing still ends.
WALL_SLACK = 2.0
# How long a call waits for a turn when TRAINYARD_IMPORT_CONCURRENCY children run already.
SLOT_WAIT_SECONDS = 10.0
LIMIT_READERS = "import_readers"

# The children running in this process: when each one's wall-clock bound ends.
_turns = threading.Condition()
_running: dict[object, float] = {}


def bounded_memory_bytes() -> int:
    return env_int("TRAINYARD_IMPORT_MEMORY_BYTES", 1024 * MiB)


def bounded_cpu_seconds() -> int:
    return env_int("TRAINYARD_IMPORT_CPU_SECONDS", 120)


def bounded_concurrency() -> int:
    """Children at once in this process (0: no limit)."""
    return env_int("TRAINYARD_IMPORT_CONCURRENCY", 2)


def bounded_running() -> int:
    with _turns:
        return len(_running)


@contextmanager
def _turn(*, bound: float) -> Iterator[None]:
    """A child's turn: at most bounded_concurrency() at once; a call that finds none free in
    SLOT_WAIT_SECONDS is refused with LaunchLimited (the API's 429, Retry-After when the first
    running child ends at the latest)."""
    most, me = bounded_concurrency(), object()
    with _turns:
        if most > 0 and not _turns.wait_for(lambda: len(_running) < most, SLOT_WAIT_SECONDS):
            retry = max(1, math.ceil(min(_running.values()) - time.monotonic()))
            raise LaunchLimited(
                f"{len(_running)} files are being read now, the most at once is {most} "
                f"(TRAINYARD_IMPORT_CONCURRENCY); retry in {retry} s",
                limit=LIMIT_READERS,
                retry_after=retry,
            )
        _running[me] = time.monotonic() + bound
    try:
        yield
    finally:
        with _turns:
            del _running[me]
            _turns.notify()


def _context(module: str) -> Any:
    context = multiprocessing.get_context("forkserver")
    # Only read before the fork server starts (the first call); later calls' modules load in
    # the child on unpickling its target, as any other import.
    context.set_forkserver_preload(["dashboard.forkserver", module])
    return context


def bounded_call(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a bounded child; its ImportRefused is raised here as it was there, and a
    child that ran out of its memory or its time is an ImportRefused of its own (413, 400).
    `fn` and its arguments and result travel by pickle: a module-level function. As with any
    multiprocessing child, the main module is imported there again: an entry point's work sits
    under `if __name__ == "__main__"` (daphne's, manage.py's, Celery's and pytest's do). It
    waits its turn (_turn): LaunchLimited where none comes."""
    memory, cpu = bounded_memory_bytes(), bounded_cpu_seconds()
    with _turn(bound=cpu + WALL_SLACK):
        return _bounded_run(fn, args, memory=memory, cpu=cpu)


def _bounded_run(fn: Callable[..., T], args: tuple[Any, ...], *, memory: int, cpu: int) -> T:
    context = _context(fn.__module__)
    receive, send = context.Pipe(duplex=False)
    env = {key: value for key, value in os.environ.items() if key.startswith(ENV_PREFIX)}
    with tempfile.TemporaryDirectory(prefix="trainyard-bounded-") as folder:
        result = Path(folder) / "result.pickle"
        child = context.Process(
            target=_child,
            args=(send, fn, args, env, memory, cpu, result),
            name="trainyard-bounded",
        )
        child.start()
        send.close()
        try:
            outcome, payload = _receive(receive, cpu + WALL_SLACK, result)
        finally:
            receive.close()
            child.kill()
            child.join()
    if outcome == "died":  # without a word: past its CPU time (SIGXCPU), or another end
        outcome = "time" if child.exitcode == -signal.SIGXCPU else "failed"
        payload = f"its reader ended with exit code {child.exitcode}"
    if outcome == "done":
        return payload
    if outcome == "refused":
        raise ImportRefused(*payload)
    if outcome == "memory":
        raise ImportRefused(413, f"reading the file needs more than {memory // MiB} MiB")
    if outcome == "time":
        raise ImportRefused(400, f"reading the file takes over {cpu} s")
    raise ImportRefused(400, f"the file could not be read ({payload})")


def _receive(receive: Connection, seconds: float, result: Path) -> tuple[str, Any]:
    """The child's outcome. Its value comes through a file, unpickled as it is read: a pipe's
    message arrives whole, so the web server would hold the pickled bytes and the value at
    once (twice an import's points)."""
    if not receive.poll(seconds):
        return "time", None
    try:
        outcome, payload = receive.recv()
    except EOFError:
        return "died", None
    if outcome != "done":
        return outcome, payload
    with result.open("rb") as written:
        return outcome, pickle.load(written)


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(
    send: Connection,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, str],
    memory: int,
    cpu: int,
    result: Path,
) -> None:
    for key in [key for key in os.environ if key.startswith(ENV_PREFIX)]:
        del os.environ[key]
    os.environ.update(env)
    limit = _address_space() + memory
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    outcome: tuple[str, Any]
    try:
        with result.open("wb") as out:
            pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
            # No memo: an unpickler keeps every memoised object (an array's bytes) until the
            # end, twice what the value holds. Values here have no cycles.
            pickler.fast = True
            pickler.dump(fn(*args))
        outcome = ("done", None)
    except ImportRefused as refused:
        outcome = ("refused", (refused.status, refused.message))
    except MemoryError:
        outcome = ("memory", None)
    except Exception as exc:  # a reader's own failure: the file's fault, said in one line
        outcome = ("failed", f"{type(exc).__name__}: {str(exc)[:200]}")
    send.send(outcome)
