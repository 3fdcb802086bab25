"""``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``), one torchrun rank per process.

Every top-level block of the model (its children that hold parameters) is sharded, then the
root (for the parameters no block holds): each rank keeps a dim-0 shard of every parameter as a
``DTensor``, all-gathers a block's parameters for its forward and backward, and reduce-scatters
the gradients, so gradients and optimizer state are sharded too (ZeRO-3's layout). With
``reshard_after_forward`` (the default) a block's gathered parameters are freed after its forward
and gathered again for backward: less memory, one more all-gather per block;
``--no-reshard-after-forward`` keeps them until backward.

The mesh is passed explicitly: without it, FSDP2 on Gloo on a machine with visible GPUs moves
the model to CUDA (pytorch#132471).

``--precision bf16`` (and ``fp16`` on GPUs) is FSDP2's own idiom rather than autocast: a
``MixedPrecisionPolicy`` that all-gathers parameters in bfloat16 (half the bytes sent), computes
in it, and reduce-scatters gradients in float32; the sharded parameters, the optimizer state and
checkpoints stay float32 (checked on the CPU's Gloo too, so one path is tested everywhere). The
root returns float32 logits, so the loss and evaluation are taken in float32. ``fp16`` adds
``torch.amp.GradScaler``, which takes DTensor gradients (pytorch#132816). ``--accumulate K``
turns gradient reduction off (``set_requires_gradient_sync(False)``) for all micro-batches but a
step's last: each rank keeps its unsharded gradients until then. ``--compile`` is not offered
here (per-block compile of sharded blocks is left for later): the CLI refuses it.

Checkpoints hold the plain model's state: the full model and optimizer state are gathered on
rank 0 (``torch.distributed.checkpoint.state_dict``, full and offloaded to the CPU), the
optimizer's keyed by parameter number as a torch optimizer's is; so an ``fsdp`` checkpoint
resumes under ``fsdp``, ``single`` or ``ddp``, and theirs under ``fsdp``. The model is sharded
after the checkpoint's weights are loaded (``training.epochs.model_build``), so resuming them
needs nothing here; the optimizer state is set back with ``set_optimizer_state_dict``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from training.checkpoint import holds_torch_optimizer
from training.config import TrainConfig
from training.memory import tensor_bytes
from training.runtime import Runtime
from training.strategies.common import Plan, optimizer_make, step_default
from training.strategies.stepping import AUTOCAST_DTYPES, step_notes, step_options

# Gathered whole, on rank 0 only, in host memory: what a plain model's checkpoint holds.
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    blocks = [name for name, child in model.named_children() if _holds_parameters(child)]
    for name in blocks:
        fully_shard(
            model.get_submodule(name), mesh=mesh, reshard_after_forward=cfg.reshard_after_forward,
            mp_policy=_precision_policy(cfg),
        )  # fmt: skip
    root = fully_shard(
        model, mesh=mesh, reshard_after_forward=cfg.reshard_after_forward,
        mp_policy=_precision_policy(cfg, output_dtype=torch.float32),
    )  # fmt: skip
    # After sharding: the optimizer steps the DTensor shards, so its state is sharded too.
    optimizer = optimizer_make(cfg, model)
    # The policy casts; autocast would only cast again.
    options = step_options(cfg, rt.device, no_sync=lambda: _no_gradient_sync(root), autocast=False)
    synchronised = "gradients are reduce-scattered once, after the last"
    return Plan(
        model=model,
        net=model,
        eval_net=model,
        optimizer=optimizer,
        step=step_default(model, optimizer, options),
        input_device=rt.device,
        output_device=rt.device,
        notes=[
            _shard_note(cfg, rt, model, blocks),
            *step_notes(cfg, synchronised, autocast=False),
            *_precision_notes(cfg),
        ],
        scaler=options.scaler,
        evaluating=lambda: _gathered(model, cfg),
        model_gather=lambda: _model_gather(model, rt),
        optimizer_gather=lambda: _optimizer_gather(model, optimizer, rt),
        optimizer_restore=lambda saved: _optimizer_restore(cfg, model, optimizer, saved),
    )


def _precision_policy(
    cfg: TrainConfig, output_dtype: torch.dtype | None = None
) -> MixedPrecisionPolicy:
    """--precision as FSDP2's policy: gathered parameters in the low precision, gradients
    reduced in float32; fp32 is the default policy (no casts)."""
    dtype = AUTOCAST_DTYPES.get(cfg.precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=output_dtype
    )


def _precision_notes(cfg: TrainConfig) -> list[str]:
    if cfg.precision not in AUTOCAST_DTYPES:
        return []
    scaler = ", a GradScaler scaling the loss" if cfg.precision == "fp16" else ""
    return [
        f"--precision {cfg.precision}: FSDP2's MixedPrecisionPolicy gathers the parameters in "
        f"{AUTOCAST_DTYPES[cfg.precision]} and computes in it (evaluation too), reduces "
        f"gradients in float32{scaler}; the sharded weights, optimizer state and checkpoints "
        "stay float32."
    ]


@contextlib.contextmanager
def _no_gradient_sync(model: FSDPModule) -> Iterator[None]:
    """FSDP2's ``no_sync``: gradients stay on each rank, unsharded, until a step's last
    micro-batch reduce-scatters their sum."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _shard_note(cfg: TrainConfig, rt: Runtime, model: nn.Module, blocks: list[str]) -> str:
    params = list(model.parameters())
    mine = sum(tensor_bytes(p) for p in params)
    whole = sum(p.numel() * p.element_size() for p in params)
    backend = "NCCL" if rt.device.type == "cuda" else "Gloo"
    reshard = (
        "freed after each block's forward and gathered again for backward"
        if cfg.reshard_after_forward
        else "kept from each block's forward until its backward (--no-reshard-after-forward)"
    )
    return (
        f"FSDP2 (fully_shard) sharded {', '.join(blocks) or 'no block'} and the root over "
        f"{rt.world_size} rank(s) ({backend}, a 1-D mesh of {rt.world_size}): each rank holds "
        f"a dim-0 shard of every parameter, {mine:,} of {whole:,} parameter bytes "
        f"({mine / max(whole, 1):.0%}), and the same share of gradients and optimizer state; "
        f"gathered parameters are {reshard}. Batches of {cfg.batch_size} per rank, "
        f"{cfg.batch_size * rt.world_size} a step."
    )


@contextlib.contextmanager
def _gathered(model: nn.Module, cfg: TrainConfig) -> Iterator[None]:
    """The whole model on every rank while it evaluates: each rank takes every world_size-th
    test image, so their batch counts may differ, and a forward that all-gathers would then
    wait forever for a rank that has none left."""
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in sharded:  # every block's own all-gather, the same order on every rank
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()
            module.set_reshard_after_forward(cfg.reshard_after_forward, recurse=False)


def _model_gather(model: nn.Module, rt: Runtime) -> dict[str, Any] | None:
    """The whole model's state on rank 0 (None on the others): a collective."""
    state = get_model_state_dict(model, options=_FULL)
    return state if rt.is_main else None


def _optimizer_gather(
    model: nn.Module, optimizer: torch.optim.Optimizer, rt: Runtime
) -> dict[str, Any] | None:
    """The whole optimizer state on rank 0, as the plain model's optimizer would hold it."""
    state = get_optimizer_state_dict(model, optimizer, options=_FULL)
    return by_number(state, _names(model)) if rt.is_main else None


def _optimizer_restore(
    cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> str:
    if not holds_torch_optimizer({"optimizer": saved}):
        return (
            "The checkpoint's optimizer state is not a torch optimizer's (another strategy "
            "wrote it); the optimizer starts afresh."
        )
    # Every rank loaded the checkpoint: each takes its own shards of the full state.
    set_optimizer_state_dict(
        model,
        optimizer,
        optim_state_dict=by_name(saved, _names(model)),
        options=StateDictOptions(full_state_dict=True),
    )
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr  # the saved learning rate would silently override --lr
    return "The optimizer state was resumed and sharded over the ranks."


def _names(model: nn.Module) -> list[str]:
    """Parameter names in the optimizer's order (``optimizer_make`` takes model.parameters())."""
    return [name for name, _ in model.named_parameters()]


def by_number(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A name-keyed optimizer state (torch.distributed.checkpoint's) keyed by parameter number,
    as ``optimizer.state_dict()`` of the plain model is."""
    number = {name: i for i, name in enumerate(names)}
    return {
        "state": {number[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [number[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of ``by_number``."""
    return {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[int(i)] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }
