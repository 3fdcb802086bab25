"""``ddp``: ``DistributedDataParallel``, one torchrun rank per process (NCCL on GPUs, Gloo on
the CPU); gradients are averaged over ranks during backward."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.config import TrainConfig
from training.runtime import Runtime
from training.strategies.common import Plan, plan_simple


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    if rt.device.type == "cuda":
        return plan_simple(
            cfg, model, DistributedDataParallel(model, device_ids=[rt.device.index]), rt.device
        )
    note = (
        f"DistributedDataParallel ran {rt.world_size} CPU process(es) over gloo, each with "
        f"{torch.get_num_threads()} thread(s) and a batch of {cfg.batch_size}, so one step "
        f"covers {cfg.batch_size * rt.world_size} images."
    )
    return plan_simple(cfg, model, DistributedDataParallel(model), rt.device, notes=[note])
