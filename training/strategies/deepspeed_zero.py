"""``deepspeed``: DeepSpeed's ZeRO engine under torchrun (stage 1 or 2, fp32).

Stage 1 partitions the optimizer state over the ranks, stage 2 the gradients as well; each rank
updates its partition and the parameters are all-gathered, so every rank ends a step with the
whole model, as in DDP. The process group is the one ``training.process.runtime`` joined (NCCL on
GPUs, Gloo on the CPU with ``DS_ACCELERATOR=cpu``); DeepSpeed uses it as it finds it.

A language model (byte-llama) trains here as under DDP: the mean cross-entropy of each next
byte, its gradients clipped over the whole model at ``MAX_NORM`` before the update, as every
strategy clips a language model's. ZeRO holds the gradients in its partitions, not in
``p.grad``, so the clipping is DeepSpeed's own (``gradient_clipping``: the same factor,
``max_norm / (norm + 1e-6)`` where the norm exceeds it), and the step's ``grad_norm`` the norm
it found.

DeepSpeed is an optional extra (``pip install -e '.[deepspeed]'``); the CLI refuses this strategy
with the install command when it is missing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch
from torch import nn

from training.config import TrainConfig
from training.observe.phases import phase
from training.process.runtime import Runtime
from training.registry import DEEPSPEED
from training.strategies.clipping import MAX_NORM, NormRead
from training.strategies.common import Plan, loss_of, optimizer_make

log = logging.getLogger(__name__)

INSTALL_HINT = DEEPSPEED.install
ZERO_STATE = "zero_partitions"  # the key of a gathered ZeRO optimizer state in a checkpoint


def ds_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": cfg.batch_size * world_size,
        "zero_optimization": {"stage": cfg.zero_stage},
        # A language model's gradients are clipped (training.strategies.clipping); 0: not.
        "gradient_clipping": MAX_NORM if cfg.language else 0.0,
        # Our torch optimizer (Adam or SGD), not one of DeepSpeed's fused ones: the same
        # update as every other strategy, so runs compare. ZeRO's list of tested optimizers
        # holds torch's Adam but not SGD: an SGD run is allowed here, and DeepSpeed warns.
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
    # Torch's own class: ZeRO checks the optimizer's exact class against its list of tested
    # ones (ZERO_SUPPORTED_OPTIMIZERS: torch's Adam among them) and warns of an "untested
    # optimizer" on any other, training/strategies/optimizers.py's Adam included.
    optimizer = optimizer_make(cfg, model, eager=False)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=ds_config(cfg, rt.world_size)
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with phase("forward"):
            loss = loss_of(engine(x), y)
        with phase("backward"):
            engine.backward(loss)
        with phase("optimizer"):
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
        ],
        started={"zero_stage": cfg.zero_stage},
        saves_optimizer=False,
        optimizer_gather=lambda: zero_state_gather(engine, cfg, rt),
        optimizer_restore=lambda saved: zero_state_restore(engine, cfg, rt, saved),
        grad_clip=NormRead(engine.get_global_grad_norm) if cfg.language else None,
    )


def zero_state_gather(engine: Any, cfg: TrainConfig, rt: Runtime) -> dict[str, Any] | None:
    """Every rank's partition of the optimizer state, gathered on rank 0 (a collective)."""
    import torch.distributed as dist

    mine = _saveable(engine.optimizer.state_dict())
    partitions: list[Any] | None = [None] * rt.world_size if rt.is_main else None
    dist.gather_object(mine, partitions, dst=0)
    if partitions is None:
        return None
    return {ZERO_STATE: partitions, "world_size": rt.world_size, "zero_stage": cfg.zero_stage}


def zero_state_restore(engine: Any, cfg: TrainConfig, rt: Runtime, saved: dict[str, Any]) -> str:
    partitions = saved.get(ZERO_STATE)
    if not isinstance(partitions, list):
        return (
            "The checkpoint's optimizer state is not ZeRO's (another strategy wrote it); the "
            "optimizer starts afresh."
        )
    where = (saved.get("world_size"), saved.get("zero_stage"))
    if where != (rt.world_size, cfg.zero_stage):
        return (
            f"The checkpoint's ZeRO optimizer state is partitioned for {where[0]} rank(s) at "
            f"stage {where[1]}, this run has {rt.world_size} at stage {cfg.zero_stage}; the "
            "optimizer starts afresh."
        )
    # Each rank takes its own partition; the master weights come from the loaded model.
    engine.optimizer.load_state_dict(partitions, load_optimizer_states=True)
    for group in engine.optimizer.param_groups:
        group["lr"] = cfg.lr  # the saved learning rate would silently override --lr
    return f"ZeRO's optimizer state resumed: {len(partitions)} partitions, one per rank."


def _saveable(value: Any) -> Any:
    """``value`` with what ``torch.load(weights_only=True)`` accepts: tensors (on the CPU),
    numbers, strings, lists and dicts; enums become their values; other objects (the loss
    scaler, fragment mappings for DeepSpeed's universal checkpoints) are left out."""
    import enum

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, enum.Enum):
        return _saveable(value.value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        kept = {k: _saveable(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not _DROPPED}
    if isinstance(value, list | tuple):
        items = [_saveable(v) for v in value]
        return [v for v in items if v is not _DROPPED]
    return _DROPPED


_DROPPED = object()
