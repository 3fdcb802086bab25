"""Hugging Face's Trainer, reporting to a Trainyard run: each rank's own loss, the Trainer's
other figures, a checkpoint and a Stop through the Trainer's own controls once every rank agrees,
and resume from the checkpoint an attempt was given.

Under a Trainyard launch every Trainer attaches by itself. By hand::

    from trainyard.integrations.huggingface import attach
    trainer = Trainer(...)
    attach(trainer)          # or Trainer(..., callbacks=[TrainyardCallback()]): no per-rank loss

The loss the Trainer logs (`on_log`) is already the mean over ranks (one all-gather at each
logging step): each rank's own comes from its training steps, which `attach` wraps, summed over
a step's micro-batches as the Trainer sums them. A checkpoint asked for, or a Stop, sets
`control.should_save` on every rank at the same step (then `should_training_stop` for a Stop):
the Trainer saves `checkpoint-<step>` in its output folder as it always does, and `on_save`
reports it, so `trainer.train(resume_from_checkpoint=...)` takes it back. Under a launch a
relative `output_dir` goes in the run's checkpoint folder (TRAINYARD_CHECKPOINT_DIR), where the
next attempt of a run that lost its worker resumes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

import trainyard
from trainyard.integrations import figures_log
from trainyard.run import Run


class TrainyardCallback(TrainerCallback):
    def __init__(self, run: Run | None = None):
        self._run = run
        self.losses: list[Any] = []  # this rank's losses of the current step (tensors)
        self.wrapped = False  # attach() wrapped the Trainer's training_step

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = trainyard.init()
        return self._run

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        run = self.run
        if self.losses:
            figures_log({"loss": float(sum(loss.item() for loss in self.losses))},
                        step=state.global_step)  # fmt: skip
            self.losses.clear()
        if run.checkpoint_requested():
            control.should_save = True
        if run.should_stop(step=state.global_step):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        figures = {
            name: value for name, value in (logs or {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }  # fmt: skip
        if self.wrapped and "loss" in figures:
            # The mean over ranks: each rank's own is its step's (on_step_end).
            figures["loss_mean"] = figures.pop("loss")
        if figures:
            figures_log(figures, step=state.global_step)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.run.checkpoint_saved(path, step=state.global_step)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.run.finish()
        return control


def attach(trainer: Any) -> TrainyardCallback:
    """Report this Trainer's run (once: a second call finds the first callback)."""
    found = [c for c in trainer.callback_handler.callbacks if isinstance(c, TrainyardCallback)]
    callback = found[0] if found else TrainyardCallback()
    if not found:
        trainer.add_callback(callback)
    folder = callback.run.checkpoint_dir
    if folder is not None and not Path(trainer.args.output_dir).is_absolute():
        # Launched: checkpoints go in the run's folder, where a later attempt finds them.
        trainer.args.output_dir = str(folder / trainer.args.output_dir)
    if not callback.wrapped:
        callback.wrapped = True
        step = trainer.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = step(*args, **kwargs)
            callback.losses.append(loss.detach())
            return loss

        trainer.training_step = training_step
        train = trainer.train

        def train_resumed(*args: Any, resume_from_checkpoint: Any = None, **kwargs: Any) -> Any:
            # The checkpoint this attempt resumes from, unless the script names one itself.
            if resume_from_checkpoint is None and not args:
                resume_from_checkpoint = callback.run.resume_path
            return train(*args, resume_from_checkpoint=resume_from_checkpoint, **kwargs)

        trainer.train = train_resumed
    return callback


def trainer_class_patch(trainer_class: Any) -> None:
    """Every Trainer made from now on attaches (the launched script's hook)."""
    init = trainer_class.__init__
    if getattr(init, "trainyard", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        attach(self)

    __init__.trainyard = True  # type: ignore[attr-defined]
    trainer_class.__init__ = __init__
