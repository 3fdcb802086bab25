"""``deepspeed``: DeepSpeed's ZeRO engine under torchrun (stage 1 or 2, fp32).

Stage 1 partitions the optimizer state over the ranks, stage 2 the gradients as well; each rank
updates its partition and the parameters are all-gathered, so every rank ends a step with the
whole model, as in DDP. The process group is the one ``training.runtime`` joined (NCCL on
GPUs, Gloo on the CPU with ``DS_ACCELERATOR=cpu``); DeepSpeed uses it as it finds it.

DeepSpeed is an optional extra (``pip install -e '.[deepspeed]'``); the CLI refuses this strategy
with the install command when it is missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.config import DEEPSPEED_REQUIREMENT, TrainConfig
from training.runtime import Runtime
from training.strategies.common import Plan, optimizer_make

log = logging.getLogger(__name__)

INSTALL_HINT = (
    f"DS_BUILD_OPS=0 pip install --no-build-isolation '{DEEPSPEED_REQUIREMENT}' "
    "(the 'deepspeed' extra of this package)"
)
OPTIMIZER_NOT_SAVED = (
    "ZeRO partitions the optimizer state over the ranks, so checkpoints of this run hold the "
    "model but not the optimizer state; a resumed run starts the optimizer afresh."
)


def ds_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": cfg.batch_size * world_size,
        "zero_optimization": {"stage": cfg.zero_stage},
        # Our torch optimizer (Adam or SGD), not one of DeepSpeed's fused ones: the same
        # update as every other strategy, so runs compare.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # progress is ours to report
        "wall_clock_breakdown": False,
    }


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    # Read when deepspeed is imported; the launcher sets it too (it reaches torchrun's ranks).
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if rt.device.type == "cuda" else "cpu")
    import deepspeed
    import deepspeed.ops

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    # On the CPU, DeepSpeed JIT-compiles a shared-memory all-reduce kernel when its comm backend
    # starts (about 45 s and a C++ compiler on first use). It serves inference_all_reduce only;
    # training goes through torch.distributed's Gloo. Marking it unavailable skips the build.
    with contextlib.suppress(Exception):
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    model.to(rt.device)
    optimizer = optimizer_make(cfg, model)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_config(cfg, rt.world_size)
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        return loss

    return Plan(
        model=model,
        net=engine,
        eval_net=model,
        optimizer=optimizer,
        step=step,
        input_device=rt.device,
        output_device=rt.device,
        notes=[
            f"DeepSpeed ZeRO stage {cfg.zero_stage} over {rt.world_size} rank(s) "
            f"({'NCCL' if rt.device.type == 'cuda' else 'Gloo, DS_ACCELERATOR=cpu'}).",
            OPTIMIZER_NOT_SAVED,
        ],
        started={"zero_stage": cfg.zero_stage},
        saves_optimizer=False,
    )
