"""What a supervisor asks of the scheduler it runs under, where that is not this machine alone.

A Celery worker's supervisor starts the training here as a child process (process.py); on
several machines each machine's worker supervises its own part (nodes.py). In a Slurm job one
supervisor starts the training on every node of the allocation through `srun`, and signals it
through the scheduler (runs/slurm/step.py). The supervisor's loop (runner.RunSupervisor) is the
same: the executor only says how the processes start, how they are reached, and what the
scheduler said meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.process import TrainingProcess


class Executor(Protocol):
    def rendezvous_flags(self, *, experiment: Experiment) -> list[str]:
        """The training's flags for where its nodes meet (training/cli.py passes them on to
        torchrun), said once for all nodes."""
        ...

    def start(
        self, *, command: list[str], tail: list[str], env: dict[str, str], cwd: Path | str
    ) -> TrainingProcess:
        """Start `command` (then `tail`: a script's "--" and its arguments) on every node."""
        ...

    def turn(self, *, supervisor: Any, now: float) -> None:
        """Each turn of the supervisor's loop (`supervisor`: the runner.RunSupervisor, which
        imports this module): act on what the scheduler said (a signal)."""
        ...

    def ended_outside(self) -> bool:
        """Whether the scheduler ended the attempt itself (a cancel, a requeue): the run is not
        this supervisor's to settle then."""
        ...
