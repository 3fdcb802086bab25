"""Where a user's script spends each step, with no line of it changed (issue 33): installed in
every rank before the script's first line (``python -m training.scripts.rank``), it measures the
same six phases as the engine's own runs (``training.observe.phases``), on the same clock.

- **Steps** end at the first optimizer's ``step`` (torch's global optimizer hooks): a window is
  a number of steps the ranks agree on (below), so every rank's window covers the same steps.
- **data**: the time in a ``DataLoader`` iterator's ``__next__``, and the samples it gave (the
  first dimension of the batch's first tensor), from which the images/s come.
- **forward**: from the outermost module's call to its return (``nn.Module.__call__`` wrapped;
  modules called inside another are not counted twice).
- **backward**: ``torch.autograd.backward`` (what ``loss.backward()`` calls).
- **optimizer**: the optimizers' ``step`` and ``zero_grad``.
- **communication** and its bytes: ``training.observe.collectives``, as for the engine: every
  ``torch.distributed`` collective called from Python, the functional ones (DTensor), and DDP's
  gradient all-reduces through a timed communication hook (the script's own hook, timed, or
  the default all-reduce's, registered at the first backward where the script has none).
- **other**: the rest of the window's wall time (the script's own work between steps).

The window's length: about TRAINYARD_OBSERVE_SECONDS (2 s) of steps, agreed as the ranks agree
on a Stop (trainyard/agree.py's Pace): at the end of each window one all-gather on a Gloo group
of the observer's own carries every rank's figures to rank 0 and each rank's proposal for the
next window, the smallest taken. Rank 0 writes the window as a protocol ``step`` event (its
``ranks`` as the engine's, no ``train_loss``: the script's loss is its own) to
``observer-0.jsonl`` beside the ranks' files, which the launcher passes on.

It fails open: a hook that raises is taken out with every other one, said once on stderr (the
rank's log), and the script goes on unobserved.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from training.observe import collectives, memory, phases
from training.observe.meter import arrival_fields
from training.observe.progress_hooks import ProgressHooks
from training.process.runtime import floats_gather
from training.scripts.profiles import PROFILE_FIGURES, ScriptProfiles, objects_gather
from trainyard.agree import Pace
from trainyard.channel import EventChannel

OBSERVER_FILE = "observer-{rank}.jsonl"
# What a rank holds (the engine's memory entry, protocol 1.7), carried in each window.
MEMORY_FIGURES = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "peak_bytes")
# The window's figures, in the order the all-gather carries them (the proposal first).
ROW = (
    "proposal", "samples", "data", "forward", "backward", "optimizer", "communication",
    "sent_bytes", "wall", "collectives", "arrival", "rss", *MEMORY_FIGURES,
    *PROFILE_FIGURES, "failed",
)  # fmt: skip
_PROCESS = psutil.Process()


class Observer:
    """One rank's observer: its hooks, the open window and the rank's channel to the launcher."""

    def __init__(self, env: dict[str, str]):
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.wait_seconds = float(env.get("TRAINYARD_OBSERVE_WAIT_SECONDS", "60"))
        every = env.get("TRAINYARD_OBSERVE_EVERY")
        self.pace = Pace(
            fixed=max(1, int(every)) if every else None,
            seconds=float(env.get("TRAINYARD_OBSERVE_SECONDS", "2")),
        )
        folder, run_id = env.get("TRAINYARD_EVENTS_DIR"), env.get("TRAINYARD_RUN_ID", "")
        self.channel = (
            EventChannel(folder, rank=0, run_id=run_id, file=OBSERVER_FILE.format(rank=0))
            if folder and self.rank == 0
            else None
        )
        # Profiles on request (profiles.py): asked in the window's row, agreed in its gather.
        send = self.channel.send if self.channel is not None else None
        self.profiles = ScriptProfiles(env, rank=self.rank, send=send)
        self.owner = threading.get_ident()  # the thread whose time the clock keeps
        self.depth = 0  # 1 inside the outermost module's call (the owner thread's)
        self.data = 0.0
        self.samples = 0
        # A resumed attempt's steps go on from its checkpoint's (the dashboard says which).
        resumed = env.get("TRAINYARD_RESUME_STEP", "")
        self.step = int(resumed) if resumed.isdigit() else 0
        self.first_optimizer: int | None = None
        # The optimizers the script made (weakly: one it drops is not kept alive), whose
        # parameters, gradients and state are what the rank holds.
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.mark = (time.perf_counter(), phases.CLOCK.read(), 0.0, 0)
        self.arrivals = phases.CLOCK.arrivals_read()  # the window's start's
        self.group: Any = None
        self.handles: list[Any] = []
        self.undo: list[Callable[[], None]] = []
        self.ddps: list[Any] = []  # DDP modules seen, to give a timed hook at the first backward
        self.failed = False
        self.begun = False
        # Every rank's progress for its launcher's stall watch (progress.py), apart from the
        # phases: it goes on where measuring stops, until the ranks leave the observer together.
        self.progress = progress_hooks(folder, self.rank)

    def begin(self) -> None:
        """The first window starts at the script's first batch or forward, not at its first line
        (its imports and data loading are no step's). On a GPU the phases are CUDA events'
        (phases.clock_for), on the device the script chose by then."""
        self.begun = True
        if self.progress is not None:
            self.progress.groups_hook()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            phases.clock_for(torch.device("cuda", torch.cuda.current_device()))
        self.mark = (time.perf_counter(), phases.CLOCK.read(), self.data, self.samples)
        self.arrivals = phases.CLOCK.arrivals_read()

    # ---- hooks ---------------------------------------------------------------------------------
    def fail_open(self, hook: Callable[..., Any], *, steps: bool = False) -> Callable[..., Any]:
        """`hook`, which on an error stops measuring and says so once: the script goes on. The
        step hook (`steps`) keeps counting steps and closing windows, so that this rank still
        meets the others at the window's all-gather: there all ranks learn of the failure and
        take every hook out at the same step (one rank's leaving alone would leave the others
        waiting in it)."""

        @functools.wraps(hook)
        def safe(*args: Any, **kwargs: Any) -> Any:
            if self.failed and not steps:
                return None
            try:
                return hook(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - the script must not die of its observer
                self.fail(f"its {hook.__name__.strip('_')} hook raised "
                          f"{type(error).__name__}: {error}")  # fmt: skip
                return None

        return safe

    def fail(self, why: str) -> None:
        """Measuring stops here (the clock off, the wrappers passing calls through); said once
        on this rank's stderr, its log."""
        if self.failed:
            return
        self.failed = True
        phases.clock_off()
        sys.stderr.write(f"trainyard's observer stopped: {why}; the script goes on, unobserved\n")
        sys.stderr.flush()

    def _timed_call(self, original: Any) -> Any:
        """``torch.nn.Module.__call__``: the outermost module's call is forward (modules called
        inside another are not counted twice); an inner module's call costs one Python frame
        and an attribute read. Global module hooks would do the same work, but their presence
        sends every module's call through torch's slow path (``_call_impl``'s ``inner``): a
        fifth of what observing cost a small CNN's step (cProfile of the script's loop)."""

        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            # Traced by torch.compile: nothing of it may run there (get_ident breaks the graph).
            if (self.depth or self.failed or threading.get_ident() != self.owner
                    or torch.compiler.is_compiling()):  # fmt: skip
                return original(module, *args, **kwargs)
            self.depth = 1
            entered = self._forward_enter(module)
            try:
                return original(module, *args, **kwargs)
            finally:
                self.depth = 0
                if entered:
                    self._clock_step("forward", leave=True)

        return call

    def _forward_enter(self, module: Any) -> bool:
        """The outermost module's call begins: forward entered on the clock (False where it
        could not be: the observer stops, the call goes on)."""
        try:
            if not self.begun:
                self.begin()
            if self.progress is not None:
                self.progress.forwarded()
            ddp = isinstance(module, torch.nn.parallel.DistributedDataParallel)
            if ddp and all(known is not module for known in self.ddps):
                self.ddps.append(module)
        except Exception as error:  # noqa: BLE001 - the script must not die of its observer
            self.fail(f"its forward hook raised {type(error).__name__}: {error}")
            return False
        return self._clock_step("forward")

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() == self.owner:
            phases.CLOCK.enter("optimizer")
            self.optimizers.add(optimizer)

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != self.owner:
            return
        if not self.failed:
            phases.CLOCK.leave()
        if self.first_optimizer is None:
            self.first_optimizer = id(optimizer)
        if id(optimizer) == self.first_optimizer:
            self.step_end()

    def _ddp_hooks_give(self) -> None:
        """A timed all-reduce for each DDP module the script gave no hook of its own (its own
        are timed when registered): at the first backward, after which none can be added."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        for module in self.ddps:
            if not module._comm_hooks and not getattr(module, "_trainyard_timed", False):
                module._trainyard_timed = True
                register = type(module).register_comm_hook.__wrapped__
                # The module's own group as the hook's state: None would mean WORLD, and
                # average a data-parallel subgroup's gradients over every rank.
                hook = collectives.hook_timed(default_hooks.allreduce_hook)
                register(module, module.process_group, hook)
        self.ddps.clear()

    # ---- windows -------------------------------------------------------------------------------
    def step_end(self) -> None:
        self.step += 1
        if self.progress is not None:
            self.progress.stepped(self.step)
        try:
            self.profiles.stepped(gather=self.objects_gather)
        except Exception as error:  # noqa: BLE001
            # A profile's end that raised on one rank (its event unwritten: a full disk) must not
            # keep this rank from closing its window at the step the others close theirs.
            sys.stderr.write(f"trainyard's profiler raised at a step: {type(error).__name__}: "
                             f"{error}; the script goes on\n")  # fmt: skip
        if self.pace.tick():
            self.window_close()

    def window_close(self) -> None:
        # Every rank reaches the all-gather at the agreed step whatever its own figures: one that
        # left for an error of its own would leave the others waiting in it.
        try:
            row = self.row_take()
        except Exception as error:  # noqa: BLE001
            self.fail(f"its window could not be read: {type(error).__name__}: {error}")
            row = [float(self.pace.proposal())] + [0.0] * (len(ROW) - 2) + [1.0]
        try:
            rows = self.rows_gather(row)
        except Exception as error:  # noqa: BLE001 - a rank that never came: see rows_gather
            self.fail(f"its ranks did not meet at step {self.step} within "
                      f"{self.wait_seconds:g} s ({type(error).__name__}: {error})")  # fmt: skip
            self.uninstall()
            return
        if any(r[-1] for r in rows):  # a rank failed: every rank leaves here, together
            self.uninstall()
            return
        if len(rows) < self.world_size:  # no group yet: no pace agreed, the next step closes
            self.pace.agreed(1)
        else:
            self.pace.agreed(int(min(r[0] for r in rows)))
            self.profiles.agreed(rows, at=ROW.index(PROFILE_FIGURES[0]), step=self.step)
        if self.channel is not None:
            self.channel.send("step", **step_fields(self.step, rows))

    def row_take(self) -> list[float]:
        """This rank's figures of the window that ends here (ROW's order), and the next one
        begun."""
        start, clock_before, data_before, samples_before = self.mark
        now, clock_now = time.perf_counter(), phases.CLOCK.read()
        spent = [after - before for after, before in zip(clock_now, clock_before, strict=True)]
        rss = float(_PROCESS.memory_info().rss)
        arrivals = phases.CLOCK.arrivals_read()
        collectives, arrival = phases.arrival_mean(self.arrivals, arrivals)
        self.mark, self.arrivals = (now, clock_now, self.data, self.samples), arrivals
        return [float(self.pace.proposal()), float(self.samples - samples_before),
                self.data - data_before, *spent, now - start, float(collectives), arrival, rss,
                *self.memory_take(), *self.profiles.row(), float(self.failed)]  # fmt: skip

    def memory_take(self) -> list[float]:
        """MEMORY_FIGURES of this rank: the parameters its optimizers hold (each once), their
        gradients, the optimizers' state, and the peak (CUDA's allocator's, else the process's
        resident set), as the engine counts them (training/observe/memory.py)."""
        params = {id(p): p for opt in list(self.optimizers) for g in opt.param_groups
                  for p in g["params"]}  # fmt: skip
        device = next((p.device for p in params.values() if p.device.type == "cuda"), None)
        return [
            float(sum(memory.tensor_bytes(p) for p in params.values())),
            float(sum(memory.tensor_bytes(p.grad) for p in params.values() if p.grad is not None)),
            float(sum(memory.optimizer_state_bytes(opt) for opt in list(self.optimizers))),
            float(memory.peak_bytes(device or torch.device("cpu"))),
        ]

    def rows_gather(self, row: list[float]) -> list[list[float]]:
        """Every rank's row, rank order, on the observer's own group (made at the first window,
        which every rank closes at the same step); its own collective is neither timed nor
        counted."""
        if self.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return [row]
        if self.group is None:
            # Bounded: ranks that take different steps (DDP's Join with uneven inputs, a learner
            # beside actors without optimizers) never all come; the observer then leaves for
            # good after this wait, rather than hold the script.
            self.group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=self.wait_seconds)
            )
            if self.progress is not None:
                self.progress.ignored = self.group
        if self.progress is not None:  # a rank that never comes leaves the others waiting here
            self.progress.entered("observer all_gather")
        rows = floats_gather(row, world_size=self.world_size, group=self.group, gather=ALL_GATHER)
        if self.progress is not None:
            self.progress.moved()
        return rows

    def objects_gather(self, value: Any) -> list[Any]:
        """Every rank's `value` on the observer's group, at a step every rank ends together (a
        profile's last), a collective the stall watch names as the window's is."""
        if self.progress is not None:
            self.progress.entered("observer all_gather")
        values = objects_gather(value, group=self.group, world_size=self.world_size)
        if self.progress is not None:
            self.progress.moved()
        return values

    # ---- installing ----------------------------------------------------------------------------
    def install(self) -> None:
        from torch.optim import optimizer as optimizers
        from torch.utils.data import dataloader

        self.handles += [
            optimizers.register_optimizer_step_pre_hook(self.fail_open(self._optimizer_pre)),
            optimizers.register_optimizer_step_post_hook(
                self.fail_open(self._optimizer_post, steps=True)
            ),
        ]  # fmt: skip
        self._wrap(torch.nn.Module, "__call__", self._timed_call)
        self._wrap(torch.autograd, "backward", self._timed_backward)
        self._wrap(torch.optim.Optimizer, "zero_grad", self._timed("optimizer"))
        self._wrap(dataloader._BaseDataLoaderIter, "__next__", self._timed_next)
        self._wrap(torch.nn.parallel.DistributedDataParallel, "register_comm_hook",
                   self._timed_registration)  # fmt: skip
        collectives.collectives_time()

    def _wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        wrapped = make(original)
        functools.update_wrapper(wrapped, original)
        setattr(owner, name, wrapped)
        self.undo.append(lambda: setattr(owner, name, original))

    def _timed(self, phase: str) -> Callable[[Any], Any]:
        """A wrapper timing its calls as `phase`; an error of the clock's (never the call's own)
        stops the observer, not the call."""

        def make(original: Any) -> Any:
            def timed(*args: Any, **kwargs: Any) -> Any:
                if self.failed or threading.get_ident() != self.owner:
                    return original(*args, **kwargs)
                if not self._clock_step(phase):
                    return original(*args, **kwargs)
                try:
                    return original(*args, **kwargs)
                finally:
                    self._clock_step(phase, leave=True)

            return timed

        return make

    def _clock_step(self, phase: str, *, leave: bool = False) -> bool:
        """`phase` entered (or left) on the clock; False where the clock raised."""
        try:
            if leave:
                phases.CLOCK.leave()
            else:
                phases.CLOCK.enter(phase)
        except Exception as error:  # noqa: BLE001 - the script must not die of its observer
            self.fail(f"its {phase} hook raised {type(error).__name__}: {error}")
            return False
        return True

    def _timed_backward(self, original: Any) -> Any:
        timed = self._timed("backward")(original)

        def backward(*args: Any, **kwargs: Any) -> Any:
            if self.ddps and not self.failed:
                self.fail_open(self._ddp_hooks_give)()
            done = timed(*args, **kwargs)
            if self.progress is not None:  # past the collectives it waited for (DDP's)
                self.progress.moved()
            return done

        return backward

    def _timed_next(self, original: Any) -> Any:
        def next_timed(iterator: Any) -> Any:
            if self.failed or threading.get_ident() != self.owner:
                return original(iterator)
            if not self.begun:
                self.begin()
            began = time.perf_counter()
            batch = original(iterator)  # StopIteration passes through, its time uncounted
            self.data += time.perf_counter() - began
            self.samples += batch_samples(batch)
            return batch

        return next_timed

    def _timed_registration(self, original: Any) -> Any:
        def register(module: Any, state: Any, hook: Any) -> Any:
            if self.failed:
                return original(module, state, hook)
            module._trainyard_timed = True
            return original(module, state, collectives.hook_timed(hook))

        return register

    def close(self) -> None:
        """At the script's end: the observer's group destroyed while the interpreter still runs
        (a Gloo group's threads left to its finalization can abort the rank: see
        trainyard.launched.entry_run), unless the script's destroy_process_group took it."""
        self.profiles.abandon("the script ended")
        if self.progress is not None:  # this rank is done: no stall to tell from it now
            self.progress.remove()
        group, self.group = self.group, None
        if group is not None and dist.is_initialized():
            # ValueError: destroyed with every group by the script; the script's exit status,
            # not an error of the observer's group, is the rank's.
            with contextlib.suppress(Exception):
                dist.destroy_process_group(group)

    def uninstall(self) -> None:
        """Every hook and wrapper out (the collectives' stay, their clock off), on every rank at
        the same step; the script goes on as if never observed."""
        self.failed = True
        phases.clock_off()
        self.profiles.abandon("trainyard's observer stopped")
        if self.progress is not None:  # the stall watch goes on, on hooks of its own
            self.progress.fallback(step=self.step)
        for handle in self.handles:
            handle.remove()
        for undo in reversed(self.undo):
            undo()
        self.handles, self.undo = [], []


ALL_GATHER = dist.all_gather  # before collectives_time wraps it: the observer's own is not timed


def batch_samples(batch: Any) -> int:
    """The samples in a batch: the first dimension of its first tensor (a tensor, a tuple or
    list of them, or a mapping: a Hugging Face batch's input_ids); 0 where there is none."""
    first = batch
    for _ in range(3):  # ((images, labels), ...) at most this deep
        if isinstance(first, torch.Tensor):
            return int(first.shape[0]) if first.dim() else 1
        if isinstance(first, dict):
            first = next(iter(first.values()), None)
        elif isinstance(first, (list, tuple)) and first:
            first = first[0]
        else:
            return 0
    return 0


def step_fields(step: int, rows: list[list[float]]) -> dict[str, Any]:
    """The window as a protocol ``step`` event's fields (1.12: no train_loss; what each rank
    holds as `memory`, as an engine's epoch event says it)."""
    ranks = []
    named = [dict(zip(ROW, values, strict=True)) for values in rows]
    late = phases.lateness([(int(row["collectives"]), row["arrival"]) for row in named])
    for rank, row in enumerate(named):
        wall = max(row["wall"], 1e-9)
        clocked = sum(row[name] for name in phases.CLOCK_PHASES)
        ranks.append({
            "rank": rank,
            "images_per_second": round(row["samples"] / wall, 1),
            "data_seconds": row["data"],
            "compute_seconds": clocked,
            "rss_bytes": int(row["rss"]),
            **{f"{name}_seconds": row[name] for name in phases.CLOCK_PHASES},
            "other_seconds": max(0.0, row["wall"] - row["data"] - clocked),
            "communication_bytes": int(row["sent_bytes"]),
            **(arrival_fields(late[rank], row["collectives"]) if late else {}),
        })  # fmt: skip
    fields: dict[str, Any] = {"epoch": 0, "step": step, "ranks": ranks, "memory": [
        {"rank": rank, **{name: int(row[name]) for name in MEMORY_FIGURES}}
        for rank, row in enumerate(named)
    ]}  # fmt: skip
    if any(r["images_per_second"] for r in ranks):
        fields["images_per_second"] = round(sum(r["images_per_second"] for r in ranks), 1)
    return fields


def progress_hooks(folder: str | None, rank: int) -> ProgressHooks | None:
    """This rank's progress record and its hooks, where a launcher watches (an events folder);
    none where they cannot start (said once: the script runs, its stalls unseen)."""
    if not folder:
        return None
    try:
        return ProgressHooks(Path(folder), rank)
    except Exception as error:  # noqa: BLE001 - the script must not die of its observer
        sys.stderr.write(f"trainyard's stall watch could not start: {type(error).__name__}: "
                         f"{error}; the script goes on\n")  # fmt: skip
        return None


def observer_install(env: dict[str, str] | None = None) -> Observer | None:
    """The observer in this rank, unless TRAINYARD_OBSERVE=0."""
    env = dict(os.environ if env is None else env)
    if env.get("TRAINYARD_OBSERVE", "1") == "0":
        return None
    observer = Observer(env)
    observer.install()
    return observer
