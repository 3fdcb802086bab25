"""``single``: one process, one device."""

from __future__ import annotations

from torch import nn

from training.config import TrainConfig
from training.process.runtime import Runtime
from training.strategies.common import Plan, plan_simple


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    notes = []
    if len(cfg.gpus) > 1:
        notes.append(
            f"The single strategy uses one device, {rt.device_label}; the other GPUs given "
            "were not used."
        )
    return plan_simple(cfg, model, model, rt.device, notes=notes)
