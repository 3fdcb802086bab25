"""``dp-primitives``: data parallelism written out with ``torch.nn.parallel``'s primitives.

What ``nn.DataParallel`` (and the functional ``data_parallel()``) do inside, step by step, on
every forward: ``scatter`` the batch in chunks over the GPUs, ``replicate`` the model onto each
(a copy of the parameters that autograd links back to the originals, so gradients from every
replica add up in the model on the first GPU), ``parallel_apply`` the replicas in threads, and
``gather`` the outputs on the output device. It needs two or more GPUs: with one there is
nothing to split, and without CUDA the primitives have no devices to use (the CLI refuses both).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import gather, parallel_apply, replicate, scatter

from training.config import TrainConfig
from training.process.runtime import Runtime
from training.strategies.common import Plan, plan_simple


class PrimitivesDataParallel(nn.Module):
    """``data_parallel(module, x, device_ids, output_device)`` as a module."""

    def __init__(self, module: nn.Module, device_ids: list[int], output_device: int) -> None:
        super().__init__()
        if len(device_ids) < 2:
            raise ValueError("dp-primitives needs two or more GPUs")
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = scatter(x, self.device_ids)  # tuple of tensors, one per device used
        used = self.device_ids[: len(chunks)]
        if len(used) == 1:  # a batch of one image: no split
            out: torch.Tensor = self.module(chunks[0])
            return out
        replicas = replicate(self.module, used)
        outputs = parallel_apply(replicas, [(c,) for c in chunks], None, used)
        gathered: torch.Tensor = gather(outputs, self.output_device)
        return gathered


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    if len(cfg.gpus) < 2 or not torch.cuda.is_available():
        # The CLI refuses this before training starts; kept for direct callers.
        raise RuntimeError(
            "dp-primitives needs two or more GPUs; "
            f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} available here"
        )
    model.to(rt.device)  # the first of --gpus: replicate() copies from there
    net = PrimitivesDataParallel(model, list(cfg.gpus), cfg.gpus[0])
    return plan_simple(
        cfg, model, net, rt.device, eval_net=net, devices=[f"cuda:{g}" for g in cfg.gpus]
    )
