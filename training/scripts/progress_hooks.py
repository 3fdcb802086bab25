"""The rank's progress hooks live in training/observe/progress_hooks.py, beside the record and the
stall watch, since the engine's runs are watched too; the script observer imports them from here."""

from training.observe.progress_hooks import ProgressHooks

__all__ = ["ProgressHooks"]
