"""Lightning's Trainer, reporting to a Trainyard run: what each rank logs (`self.log` in a
LightningModule reaches every rank's loggers with that rank's value unless `sync_dist`), a
checkpoint and a Stop once every rank agrees, through the Trainer's own `save_checkpoint` and
`should_stop`, and resume from the checkpoint an attempt was given (`fit(ckpt_path=...)`).

Under a Trainyard launch every Trainer attaches by itself. By hand::

    from trainyard.integrations.lightning import TrainyardCallback, TrainyardLogger
    Trainer(..., logger=TrainyardLogger(), callbacks=[TrainyardCallback()])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger

import trainyard
from trainyard.integrations import figures_log
from trainyard.run import Run


def _run() -> Run:
    return trainyard.init()


class TrainyardLogger(Logger):
    """Every figure Lightning logs on this rank, at its step: rank/<r>/<name> on the server."""

    @property
    def name(self) -> str:
        return "trainyard"

    @property
    def version(self) -> str:
        run_id = _run().id
        return "" if run_id is None else str(run_id)

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        figures = {k: v for k, v in metrics.items() if not isinstance(v, bool)}
        if figures:
            figures_log(figures, step=step)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The run's settings are its arguments, which the run already records."""


class TrainyardCallback(Callback):
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        run, step = _run(), trainer.global_step
        asked = run.checkpoint_requested()
        stop = run.should_stop(step=step)
        if asked or stop:
            folder = run.checkpoint_dir or Path(trainer.default_root_dir)
            path = Path(folder) / f"step-{step}.ckpt"
            trainer.save_checkpoint(path)  # every rank calls it; rank 0 writes
            run.checkpoint_saved(path, step=step)
        if stop:
            trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        _run().finish()


def trainer_class_patch(trainer_class: Any) -> None:
    """Every Trainer made from now on attaches, and its fit resumes where the attempt was told
    to (the launched script's hook)."""
    init, fit = trainer_class.__init__, trainer_class.fit
    if getattr(init, "trainyard", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not any(isinstance(c, TrainyardCallback) for c in self.callbacks):
            self.callbacks.append(TrainyardCallback())
        if not any(isinstance(logger, TrainyardLogger) for logger in self.loggers):
            self.loggers = [*self.loggers, TrainyardLogger()]

    def fit_resumed(self: Any, *args: Any, ckpt_path: Any = None, **kwargs: Any) -> Any:
        if ckpt_path is None and len(args) < 4:  # (model, train, val, datamodule, ckpt_path)
            ckpt_path = _run().resume_path
        return fit(self, *args, ckpt_path=ckpt_path, **kwargs)

    __init__.trainyard = True  # type: ignore[attr-defined]
    trainer_class.__init__ = __init__
    trainer_class.fit = fit_resumed
