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

Checkpoints hold the plain model's state, gathered on rank 0 (``training.strategies.full_state``,
shared with tensor parallel): an ``fsdp`` checkpoint resumes under ``fsdp``, ``single`` or
``ddp``, and theirs under ``fsdp``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from training.config import TrainConfig
from training.models.byte_llama.model import ByteLlama
from training.models.byte_llama.parallelize import apply_fsdp
from training.observe.memory import tensor_bytes
from training.process.runtime import Runtime
from training.strategies.common import Plan
from training.strategies.full_state import plan_sharded
from training.strategies.stepping import AUTOCAST_DTYPES


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    blocks = blocks_shard(
        model, mesh, reshard_after_forward=cfg.reshard_after_forward, precision=cfg.precision
    )
    return plan_sharded(
        cfg, rt, model,
        notes=[_shard_note(cfg, rt, model, blocks), *_precision_notes(cfg)],
        evaluating=lambda: gathered(model, cfg),
        # The policy casts (autocast would only cast again); --accumulate's micro-batches before
        # a step's last keep their gradients unreduced.
        autocast=False,
        no_sync=lambda: _no_gradient_sync(model),
    )  # fmt: skip


def blocks_shard(
    model: nn.Module, mesh: DeviceMesh, *, reshard_after_forward: bool, precision: str = "fp32"
) -> list[str]:
    """``fully_shard`` each top-level block that holds parameters, then the root, with
    ``precision``'s policy; returns the blocks' names. A language model is sharded by its own
    plan (torchtitan's: the embedding, each layer, [norm, output], the root)."""
    if isinstance(model, ByteLlama):
        return apply_fsdp(
            model, mesh, reshard_after_forward=reshard_after_forward,
            policy=_precision_policy(precision),
            root_policy=_precision_policy(precision, output_dtype=torch.float32),
        )  # fmt: skip
    blocks = [name for name, child in model.named_children() if _holds_parameters(child)]
    for name in blocks:
        fully_shard(
            model.get_submodule(name), mesh=mesh, reshard_after_forward=reshard_after_forward,
            mp_policy=_precision_policy(precision),
        )  # fmt: skip
    fully_shard(
        model, mesh=mesh, reshard_after_forward=reshard_after_forward,
        mp_policy=_precision_policy(precision, output_dtype=torch.float32),
    )  # fmt: skip
    return blocks


def _precision_policy(
    precision: str, output_dtype: torch.dtype | None = None
) -> MixedPrecisionPolicy:
    """--precision as FSDP2's policy: gathered parameters in the low precision, gradients
    reduced in float32; fp32 is the default policy (no casts)."""
    dtype = AUTOCAST_DTYPES.get(precision)
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
def _no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's ``no_sync``: gradients stay on each rank, unsharded, until a step's last
    micro-batch reduce-scatters their sum."""
    assert isinstance(model, FSDPModule)  # fully_shard made the root one
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
def gathered(model: nn.Module, cfg: TrainConfig) -> Iterator[None]:
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
