"""The frameworks' own controls, wired to a Trainyard run: Hugging Face's Trainer
(huggingface.py), Lightning's Trainer (lightning.py) and TensorBoard's SummaryWriter
(tensorboard.py).

Under a Trainyard launch they attach by themselves (trainyard.launched installs HOOKS before the
script's first line; TRAINYARD_INTEGRATIONS=none turns that off); elsewhere a script attaches
them by hand (each module says how). Each module imports its framework, so it is imported only
once the script has imported that framework.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

import trainyard
from trainyard.hooks import Hook

_warned: set[str] = set()


def figures_log(figures: dict[str, Any], *, step: int | None) -> None:
    """run.log for an integration, failing open: figures the run refuses (too many, not numbers)
    are said once on stderr and left out; the script goes on (an observer never breaks what it
    watches)."""
    try:
        trainyard.init().log(figures, step=step)
    except (TypeError, ValueError) as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            print(f"trainyard: figures not reported ({exc})", file=sys.stderr)


def _huggingface(module: ModuleType) -> None:
    from trainyard.integrations.huggingface import trainer_class_patch

    trainer_class_patch(module.Trainer)


def _lightning(module: ModuleType) -> None:
    from trainyard.integrations.lightning import trainer_class_patch

    trainer_class_patch(module.Trainer)


def _tensorboard(module: ModuleType) -> None:
    from trainyard.integrations.tensorboard import writer_class_patch

    writer_class_patch(module.SummaryWriter)


# The module that defines each framework's class, and what attaches to it once imported.
HOOKS: dict[str, Hook] = {
    "transformers.trainer": _huggingface,
    "lightning.pytorch.trainer.trainer": _lightning,
    "torch.utils.tensorboard.writer": _tensorboard,
}


def hooks_wanted() -> dict[str, Hook]:
    """HOOKS, unless TRAINYARD_INTEGRATIONS says "none" (or lists the ones wanted by name:
    huggingface, lightning, tensorboard)."""
    wanted = os.environ.get("TRAINYARD_INTEGRATIONS", "all").strip().lower()
    if wanted == "all":
        return dict(HOOKS)
    names = {"huggingface": _huggingface, "lightning": _lightning, "tensorboard": _tensorboard}
    chosen = {names[n] for n in wanted.replace(",", " ").split() if n in names}
    return {module: hook for module, hook in HOOKS.items() if hook in chosen}
