"""The parent's side of Hogwild's processes: start them, hear from them, stop them.

The spawner imports the process loop (``process.process_main``); nothing imports back.
"""

from __future__ import annotations

import queue
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch.multiprocessing as mp
from torch import nn

from training.epochs import EpochStart
from training.strategies.hogwild.messages import (
    ProcessArgs,
    ProcessFailed,
    ProcessMessage,
    Ready,
    Stop,
)
from training.strategies.hogwild.process import process_main

START_TIMEOUT_S = 300.0  # spawning imports torch in each process; slow disks, many processes
STOP_TIMEOUT_S = 30.0


@dataclass
class Processes:
    """The parent's side of the processes: their queues and the request flag."""

    ctx: Any  # the spawn context
    results: Any  # one queue, every process to the parent
    # Set by the parent when a checkpoint is requested; process 0 answers with its state.
    wanted: Any
    processes: list[Any] = field(default_factory=list)
    controls: list[Any] = field(default_factory=list)  # one queue each, parent to process

    @classmethod
    def spawning(cls) -> Processes:
        ctx = mp.get_context("spawn")
        return cls(ctx, ctx.Queue(), ctx.Event())

    def start(self, args: ProcessArgs, model: nn.Module) -> None:
        control = self.ctx.SimpleQueue()
        process = self.ctx.Process(
            target=process_main,
            args=(args, model, self.results, control, self.wanted),
            name=f"trainyard-hogwild-{args.rank}",
            daemon=True,
        )
        _start_with_requests_blocked(process)
        self.processes.append(process)
        self.controls.append(control)

    def ready(self) -> list[Ready]:
        """Every process's Ready, in rank order."""
        ready = []
        for _ in self.processes:
            message = self.receive(START_TIMEOUT_S)
            if not isinstance(message, Ready):
                raise RuntimeError(f"expected Ready from a Hogwild process, got {message}")
            ready.append(message)
        return sorted(ready, key=lambda m: m.rank)

    def send(self, command: EpochStart | Stop) -> None:
        for control in self.controls:
            control.put(command)

    def receive(self, timeout: float | None) -> ProcessMessage:
        """The next message from any process; raises if one failed or died, or if none spoke
        for ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                message: ProcessMessage = self.results.get(timeout=0.5)
            except queue.Empty:
                self._dead_raise()
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no word from the Hogwild processes in {timeout} s"
                    ) from None
                continue
            if isinstance(message, ProcessFailed):
                raise RuntimeError(f"Hogwild process {message.rank} failed:\n{message.traceback}")
            return message

    def _dead_raise(self) -> None:
        dead = [(r, p.exitcode) for r, p in enumerate(self.processes) if p.exitcode is not None]
        if dead:
            raise RuntimeError(
                "Hogwild process(es) ended unexpectedly: "
                + ", ".join(f"rank {r} with exit code {code}" for r, code in dead)
            ) from None

    def join(self) -> None:
        """Tell the processes to exit, and wait for them."""
        self.send(Stop())
        for process in self.processes:
            process.join(STOP_TIMEOUT_S)

    def close(self) -> None:
        """Stop whatever still runs, and let go of the results queue."""
        processes_stop(self.processes)
        self.results.close()
        self.results.cancel_join_thread()


def _start_with_requests_blocked(process: Any) -> None:
    """Start a process with SIGUSR1 blocked, as it starts (the mask survives exec, a handler
    does not): one sent to every process of the run before this one ignores it would kill
    it. The parent's own request, if one came meanwhile, is delivered when it unblocks."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


def processes_stop(processes: list[Any], grace: float = 5.0) -> None:
    """SIGTERM the processes still running, wait, then SIGKILL what is left; reap them all."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join(5.0)
