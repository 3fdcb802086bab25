"""What travels between Hogwild's parent and its processes.

Module-level and picklable: spawn pickles them through the queues. Tensors inside travel as
handles to shared memory (torch.multiprocessing's pickler), as they would in a tuple. The parent
starts an epoch with ``training.epochs.EpochStart``, the driver's own description of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.config import TrainConfig
from training.data.shared_data import Segment
from training.protocol import MemoryEntry


@dataclass(frozen=True)
class ProcessArgs:
    """What a process is started with."""

    rank: int
    cfg: TrainConfig
    segment: Segment | None  # None: no shared copy could be made, load privately
    optimizer_state: dict[str, Any] | None
    threads: int
    parent_pid: int
    data_mode: str = "resident"  # the parent's choice; "streaming": each process reads the files


@dataclass(frozen=True)
class Stop:
    """Parent to process: the run is over, exit."""


@dataclass(frozen=True)
class Ready:
    """Process to parent: started, data mapped, optimizer built."""

    rank: int
    pid: int
    data_shared: list[bool]  # shared_flags(data): which dataset tensors it maps shared
    params_shared: list[bool]  # is_shared() of each model parameter, as it sees them


@dataclass(frozen=True)
class StepReport:
    """Process to parent: its meter row for the steps since its last report."""

    rank: int
    epoch: int
    local: int  # the process's step within this epoch's run, 1-based
    row: list[float]  # Window.row()


@dataclass(frozen=True)
class CheckpointCopy:
    """Process 0 to parent: its model and optimizer as of its step ``local``, on request."""

    rank: int
    local: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]


@dataclass(frozen=True)
class EpochDone:
    """Process to parent: finished the epoch."""

    rank: int
    epoch: int
    row: list[float]  # the whole epoch's Window.row()
    optimizer_state: dict[str, Any] | None  # a copy, where the run writes checkpoints
    memory: MemoryEntry | None = None  # what it holds (observe.memory), the shared model too


@dataclass(frozen=True)
class ProcessFailed:
    rank: int
    traceback: str


ProcessMessage = Ready | StepReport | CheckpointCopy | EpochDone | ProcessFailed
