"""One module per strategy, found through the registry (``training.registry``).

A strategy module exposes either ``plan_build``, which places and wraps the model and returns a
``Plan`` that the shared loop (``training.engine``) drives, or ``train``, for a strategy that
runs its own processes and loop (``hogwild``). ``own_trainer`` tells the engine which.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from torch import nn

from training.config import TrainConfig
from training.process.runtime import Runtime
from training.protocol import EventWriter
from training.registry import strategy_get
from training.strategies.common import Plan

Trainer = Callable[[TrainConfig, Runtime, EventWriter], None]  # a strategy's own ``train``


def strategy_module(name: str) -> ModuleType:
    """``training.strategies.<module>`` of the strategy called ``name``."""
    spec = strategy_get(name)
    if spec.user_script:  # the CLI launches the user's script before the engine: no module
        raise ValueError(f"strategy {name!r} runs your own script: the engine has no module for it")
    return importlib.import_module(f"{__name__}.{spec.module}")


def own_trainer(cfg: TrainConfig) -> Trainer | None:
    """The strategy's own ``train`` where it runs its own loop; None where it builds a plan."""
    trainer: Trainer | None = getattr(strategy_module(cfg.strategy), "train", None)
    return trainer


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    """Place ``model`` (built for the dataset, weights loaded) and wrap it for ``cfg``."""
    module = strategy_module(cfg.strategy)
    if not hasattr(module, "plan_build"):
        raise ValueError(f"no training plan for strategy {cfg.strategy!r}")
    plan: Plan = module.plan_build(cfg, rt, model)
    return plan


__all__ = ["Plan", "Trainer", "own_trainer", "plan_build", "strategy_module"]
