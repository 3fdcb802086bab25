"""``ddp``: ``DistributedDataParallel``, one torchrun rank per process (NCCL on GPUs, Gloo on
the CPU); gradients are averaged over ranks during backward.

BatchNorm is the one layer whose forward differs from a single process's at the same global
batch: each rank normalises with its own shard's batch statistics, and the running ones are
rank 0's (DDP broadcasts its buffers every step). The run says so; on GPUs ``--sync-batchnorm``
converts it to ``SyncBatchNorm``, statistics over all ranks (the CLI refuses it on the CPU,
where torch's does not run)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from training.config import TrainConfig
from training.runtime import Runtime
from training.strategies.common import Plan, plan_simple


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    notes = batchnorm_notes(cfg, model, rt.world_size)
    if cfg.sync_batchnorm:
        # Same buffers and parameters, so the state dict (checkpoints) keeps its keys.
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(rt.device)
    if rt.device.type == "cuda":
        net = DistributedDataParallel(model, device_ids=[rt.device.index])
        return plan_simple(cfg, model, net, rt.device, notes=notes)
    notes.insert(
        0,
        f"DistributedDataParallel ran {rt.world_size} CPU process(es) over gloo, each with "
        f"{torch.get_num_threads()} thread(s) and a batch of {cfg.batch_size}, so one step "
        f"covers {cfg.batch_size * rt.world_size} images.",
    )
    return plan_simple(cfg, model, DistributedDataParallel(model), rt.device, notes=notes)


def batchnorm_notes(cfg: TrainConfig, model: nn.Module, world: int) -> list[str]:
    """What the run's BatchNorm layers do over ``world`` ranks, if it has any."""
    count = sum(isinstance(m, _BatchNorm) for m in model.modules())
    if not count:
        return []
    if cfg.sync_batchnorm:
        return [
            f"{cfg.model}: its {count} BatchNorm layer(s) became SyncBatchNorm (--sync-batchnorm): "
            f"batch statistics are taken over all {world} ranks, as one process would."
        ]
    return [
        f"{cfg.model} has {count} BatchNorm layer(s): each of the {world} ranks normalises with "
        f"its own shard's batch statistics (batches of {cfg.batch_size}, not "
        f"{cfg.batch_size * world}), so a step is not the one a single process takes on the "
        "global batch; the running statistics are rank 0's (DDP broadcasts its buffers every "
        "step). --sync-batchnorm (GPUs) takes the statistics over all ranks."
    ]
