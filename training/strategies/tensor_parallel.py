"""``tensor-parallel``: the model's declared linear layers split over the ranks, one torchrun
rank per process (``torch.distributed.tensor.parallel.parallelize_module``).

The plan comes with the model (``training.models.build.model_tensor_plan``): simple-cnn's names its
classifier's two linear layers, the first split column-wise (each rank computes 1/N of the
hidden features), the second row-wise (each rank multiplies its 1/N of them, and one all-reduce
sums the logits). Their weights become ``DTensor`` shards, so each rank holds 1/N of them, of
their gradients and of their optimizer state. The rest (the convolutions) is replicated: every
rank holds it whole and computes it on the same input, so its gradients agree without any
communication. The mesh is passed explicitly, as FSDP2's is, so that Gloo on a machine with
visible GPUs stays on the CPU.

The ranks split the model, not the data: all of them train on the same batch of --batch-size
images (one ``DataShard`` for all), so the global batch is --batch-size whatever the number of
ranks, and the training is single's at that batch. Every rank evaluates the whole test split
through the split model (its all-reduces keep the ranks in step). Checkpoints are the plain
model's, gathered on rank 0 (``training.strategies.full_state``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from training.config import TrainConfig
from training.data.batching import DataShard
from training.models.build import model_tensor_plan, tensor_plan_widths_check
from training.models.byte_llama.model import ByteLlama
from training.models.byte_llama.parallelize import apply_tp, tp_plan_text
from training.models.language_plugin import language_plugin_plan, plan_words
from training.observe.memory import tensor_bytes
from training.process.runtime import Runtime
from training.strategies.common import Plan
from training.strategies.full_state import plan_sharded

# The plan's words (training.models.build.TENSOR_STYLES), as torch's styles.
STYLES: dict[str, type[ParallelStyle]] = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    if cfg.language:
        return _language_plan(cfg, rt, model, mesh)
    plan = tensor_split(cfg.model, model, mesh)
    note = (
        f"Tensor parallel (parallelize_module) over {rt.world_size} rank(s) "
        f"({backend_name(rt)}, a 1-D mesh of {rt.world_size}): {plan_text(plan)}, the rest "
        f"replicated; {held_text(model)}. The ranks split the model, not the data: "
        f"all train on the same batch, so the global batch is --batch-size ({cfg.batch_size}) "
        "whatever the number of ranks."
    )
    return plan_sharded(cfg, rt, model, notes=[note], data_shard=DataShard(0, 1))


def _language_plan(cfg: TrainConfig, rt: Runtime, model: nn.Module, mesh: DeviceMesh) -> Plan:
    """A language model split by its own plan (``language_split``), its loss taken under
    ``loss_parallel``: the logits stay split by vocabulary, each rank taking the softmax of its
    share (two small all-reduces instead of gathering the logits)."""
    split = language_split(cfg, model, mesh)
    note = (
        f"Tensor parallel over {rt.world_size} rank(s) ({backend_name(rt)}, a 1-D mesh of "
        f"{rt.world_size}), {split}; "
        f"{held_text(model)}. The ranks split the model, not the data: all train on the same "
        f"batch, so the global batch is --batch-size ({cfg.batch_size}) whatever the number "
        "of ranks."
    )
    return plan_sharded(
        cfg, rt, model, notes=[note], data_shard=DataShard(0, 1), loss_context=loss_parallel
    )


def language_split(cfg: TrainConfig, model: nn.Module, mesh: DeviceMesh) -> str:
    """Split a language model over ``mesh`` (1-D) by its plan; returns the plan in words:
    byte-llama's is torchtitan's (``byte_llama.parallelize``), a plug-in's its own
    (``models.language_plugin``)."""
    if isinstance(model, ByteLlama):
        apply_tp(model, mesh, sequence_parallel=cfg.sequence_parallel)
        return f"torchtitan's plan: {tp_plan_text(cfg.sequence_parallel)}"
    plan = language_plugin_plan(cfg.model, model)
    parallelize_module(model, mesh, plan)
    return plan_words(plan)


def tensor_split(name: str, model: nn.Module, mesh: DeviceMesh) -> dict[str, str]:
    """Split ``model``'s layers over ``mesh`` (1-D) as its declared plan says; returns the plan.
    Refused (ModelRefused) where the model declares none, or where the mesh's size does not
    divide a width the plan splits (said before any rank has split anything)."""
    plan = model_tensor_plan(name, model)
    tensor_plan_widths_check(name, model, plan, mesh.size())
    parallelize_module(model, mesh, {path: STYLES[style]() for path, style in plan.items()})
    return plan


def plan_text(plan: dict[str, str]) -> str:
    """ "classifier.1 column-wise, classifier.3 row-wise"."""
    words = {"colwise": "column-wise", "rowwise": "row-wise"}
    return ", ".join(f"{path} {words[style]}" for path, style in plan.items())


def held_text(model: nn.Module) -> str:
    """ "each rank holds 803,584 of 1,625,864 parameter bytes (49%)"."""
    params = list(model.parameters())
    mine = sum(tensor_bytes(p) for p in params)
    whole = sum(p.numel() * p.element_size() for p in params)
    return (
        f"each rank holds {mine:,} of {whole:,} parameter bytes ({mine / max(whole, 1):.0%}), "
        "and the same share of their gradients and optimizer state"
    )


def backend_name(rt: Runtime) -> str:
    return "NCCL" if rt.device.type == "cuda" else "Gloo"
