"""``fsdp-tp``: 2-D parallelism, PyTorch's recipe: tensor parallel over one dimension of a device
mesh, FSDP2 over the other.

The ranks form a (dp, tp) mesh, ``init_device_mesh(device, (world / 2, 2), mesh_dim_names=("dp",
"tp"))``: neighbouring ranks pair up (tp = 2, ``StrategySpec.tensor_ranks``), because tensor
parallel's all-reduces come in every forward and backward and want the fastest link (two GPUs of
one machine); FSDP2's gathers and reduce-scatters, once per block, go across the pairs. A world
that does not factor (odd, or under 4: both dimensions need 2) is refused before training
(``training.refusals.strategy_refusals``).

First each pair splits the model's declared linear layers as ``tensor-parallel`` does (over the
"tp" dimension), then ``fully_shard`` shards every block and the root over "dp", as ``fsdp``
does: a split weight becomes a 2-D ``DTensor``, each rank holding 1/world of it, the replicated
rest 1/dp. The data is sharded over dp only: both ranks of a pair train on one slice of
--batch-size images, so the global batch is --batch-size x dp. For evaluation the FSDP2 shards
are gathered (``fsdp.gathered``: the dp ranks may run different numbers of test batches), and
each pair runs its slice of the test split through its tensor-parallel layers. Checkpoints are
the plain model's (``training.strategies.full_state``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from training.config import TrainConfig
from training.data.batching import DataShard
from training.process.runtime import Runtime
from training.registry import mesh_shape
from training.strategies.common import Plan
from training.strategies.fsdp import blocks_shard, gathered
from training.strategies.full_state import plan_sharded
from training.strategies.tensor_parallel import (
    backend_name,
    held_text,
    language_split,
    plan_text,
    tensor_split,
)


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    dp, tp = mesh_shape(cfg.strategy, rt.world_size)
    mesh = init_device_mesh(rt.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    language = cfg.language
    if language:  # its own plan (byte-llama's torchtitan's), its loss split by vocabulary
        split = language_split(cfg, model, mesh["tp"])
    else:
        split = plan_text(tensor_split(cfg.model, model, mesh["tp"]))
    blocks = blocks_shard(model, mesh["dp"], reshard_after_forward=cfg.reshard_after_forward)
    note = (
        f"FSDP2 + tensor parallel on a 2-D mesh of {rt.world_size} ranks ({backend_name(rt)}, "
        f"dp {dp} x tp {tp}; tp is 2, neighbouring ranks, dp the rest): tensor parallel within "
        f"each pair ({split}), then fully_shard of {', '.join(blocks)} and the root "
        f"over dp; {held_text(model)}. Each pair trains on one batch of --batch-size "
        f"({cfg.batch_size}): {cfg.batch_size * dp} a step over {dp} pairs."
    )
    extra = {"loss_context": loss_parallel} if language else {}
    return plan_sharded(
        cfg, rt, model,
        notes=[note],
        evaluating=lambda: gathered(model, cfg),
        data_shard=DataShard(mesh["dp"].get_local_rank(), dp),
        **extra,
    )  # fmt: skip
