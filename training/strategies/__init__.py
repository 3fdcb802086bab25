"""One module per strategy; each builds a ``Plan``: what the shared training loop calls.

``hogwild`` is the exception: its processes run the loop themselves (``hogwild.train``).
"""

from __future__ import annotations

import importlib

from torch import nn

from training.config import TrainConfig
from training.runtime import Runtime
from training.strategies.common import Plan

_MODULES = {
    "single": "single",
    "dp": "dp",
    "ddp": "ddp",
    "dp-primitives": "dp_primitives",
    "model-parallel": "model_parallel",
    "deepspeed": "deepspeed_zero",
}


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    """Place ``model`` (a bare SimpleCNN, weights already loaded) and wrap it for ``cfg``."""
    if cfg.strategy not in _MODULES:
        raise ValueError(f"no training plan for strategy {cfg.strategy!r}")
    module = importlib.import_module(f"training.strategies.{_MODULES[cfg.strategy]}")
    plan: Plan = module.plan_build(cfg, rt, model)
    return plan


__all__ = ["Plan", "plan_build"]
