"""``dp``: ``nn.DataParallel`` over --gpus, one process; without GPUs a pass-through."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.config import TrainConfig
from training.process.runtime import Runtime
from training.strategies.common import Plan, plan_simple

DP_WITHOUT_GPUS = (
    "DataParallel needs GPUs and none were found, so this run ran as a single CPU process "
    "with no parallelism."
)


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    extra: dict[str, Any]
    if cfg.gpus:
        net = nn.DataParallel(model, device_ids=list(cfg.gpus), output_device=cfg.gpus[0])
        notes = []
        if len(cfg.gpus) == 1:
            notes.append("DataParallel over one GPU gives no parallelism; list more with --gpus.")
        extra = {"notes": notes, "devices": [f"cuda:{g}" for g in cfg.gpus]}
    elif torch.cuda.is_available():
        raise RuntimeError("--strategy dp on a machine with GPUs needs --gpus")
    else:
        # Without a GPU, DataParallel keeps device_ids empty and just calls the module.
        net = nn.DataParallel(model)
        extra = {"notes": [DP_WITHOUT_GPUS], "warnings": [DP_WITHOUT_GPUS]}
    return plan_simple(cfg, model, net, rt.device, eval_net=net, **extra)
