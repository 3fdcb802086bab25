"""How ``byte-llama`` is split over ranks: torchtitan's plans
(``torchtitan/models/llama3/infra/parallelize.py``), one function each, applied in its order:
tensor parallel first, then FSDP2; and the pipeline's cut by layer.

``apply_tp``: per block, the attention's and feed-forward's input projections column-wise
(``wq``/``wk``/``wv``, ``w1``/``w3``: each rank computes its heads and its share of the SwiGLU
width) and their output projections row-wise (``wo``, ``w2``); the embedding row-wise (each rank
holds the rows of its share of the vocabulary), the output column-wise, its logits left split
by vocabulary for ``loss_parallel``. With sequence parallel (on by
default, as torchtitan's), the norms and the residual stream between the blocks are split by
sequence position: ``SequenceParallel`` on the norms, the row-wise projections reduce-scatter to
a sequence shard instead of all-reducing, and ``PrepareModuleInput`` all-gathers each
attention's and feed-forward's input back to whole windows. Without it (Megatron's plan), the
norms are replicated and each row-wise projection all-reduces.

``apply_fsdp``: ``fully_shard`` on the embedding, on each block, on ``[norm, output]`` together
(not resharded after forward: backward needs them at once), then the root.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from training.models.byte_llama.model import ByteLlama


def apply_tp(model: ByteLlama, tp_mesh: DeviceMesh, *, sequence_parallel: bool = True) -> None:
    """Tensor parallel over ``tp_mesh`` (1-D), the output's logits split by vocabulary (the
    loss is taken under ``loss_parallel``)."""
    between = Shard(1) if sequence_parallel else Replicate()  # the residual stream's layout
    top: dict[str, ParallelStyle] = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "output": ColwiseParallel(
            input_layouts=between, output_layouts=Shard(-1), use_local_output=False
        ),
    }
    if sequence_parallel:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, ParallelStyle] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=between),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=between),
            "feed_forward.w3": ColwiseParallel(),
        }
        if sequence_parallel:
            plan |= {
                "attention_norm": SequenceParallel(),
                # (x, rotary table): x gathered from its sequence shards, the table as is.
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
            }
        parallelize_module(block, tp_mesh, plan)


def tp_plan_text(sequence_parallel: bool) -> str:
    """The plan in words, for the run's notes."""
    between = (
        "norms and residual stream split by sequence (SequenceParallel), each block's input "
        "all-gathered (PrepareModuleInput) and its output projections reduce-scattered"
        if sequence_parallel
        else "norms replicated, the output projections all-reduced (--no-sequence-parallel)"
    )
    return (
        "per block wq, wk, wv, w1, w3 column-wise and wo, w2 row-wise; tok_embeddings "
        f"row-wise, output column-wise with its logits split by vocabulary (loss_parallel); "
        f"{between}"
    )


def apply_fsdp(
    model: ByteLlama,
    dp_mesh: DeviceMesh,
    *,
    reshard_after_forward: bool,
    policy: MixedPrecisionPolicy,
    root_policy: MixedPrecisionPolicy,
) -> list[str]:
    """FSDP2 as torchtitan applies it; returns the units sharded, in order."""
    fully_shard(
        model.tok_embeddings, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
        mp_policy=policy,
    )  # fmt: skip
    units = ["tok_embeddings"]
    for name, block in model.layers.items():
        fully_shard(
            block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy
        )
        units.append(f"layers.{name}")
    # Gathered for the forward's end and backward's start at once: not resharded between them.
    fully_shard([model.norm, model.output], mesh=dp_mesh, reshard_after_forward=False,
                mp_policy=policy)  # fmt: skip
    fully_shard(
        model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=root_policy
    )
    return [*units, "[norm, output]"]


class LanguageStage(nn.Module):
    """One pipeline stage of ``byte-llama``: its layers (keeping their names), the embedding on
    the first stage, the norm and output on the last. The rotary table is the model's (not a
    child: each stage computes its layers' rotations from it)."""

    def __init__(self, model: ByteLlama, layers: list[int], *, first: bool, last: bool) -> None:
        super().__init__()
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in layers})
        self.norm = model.norm if last else None
        self.output = model.output if last else None
        self.root = [model]  # a list: not a child, its parameters are the stages'
        # (name, module) of the model's parts this stage runs, in order (notes, stage tables)
        named: list[tuple[str, nn.Module]] = []
        named += [("tok_embeddings", model.tok_embeddings)] if first else []
        named += [(f"layers.{i}", model.layers[str(i)]) for i in layers]
        named += [("norm", model.norm), ("output", model.output)] if last else []
        self.names = [name for name, _ in named]
        self.parts = [module for _, module in named]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h, self.root[0].rotary)
        if self.norm is not None and self.output is not None:
            h = self.output(self.norm(h))
        return h


def pipeline_stages(model: ByteLlama, stages: int) -> list[LanguageStage]:
    """The model cut by layer into ``stages`` stages (``stage_layers``)."""
    cuts = stage_layers(model.size.n_layers, stages)
    return [
        LanguageStage(model, layers, first=i == 0, last=i == stages - 1)
        for i, layers in enumerate(cuts)
    ]


def stage_layers(n_layers: int, stages: int) -> list[list[int]]:
    """The layers of each pipeline stage, in order, as even as they go (the first stages take
    one more where they do not divide): the embedding joins the first, norm and output the
    last (torchtitan's split by layer)."""
    if not 1 <= stages <= n_layers:
        raise ValueError(f"{n_layers} layers do not cut into {stages} stages")
    base, extra = divmod(n_layers, stages)
    cuts, at = [], 0
    for stage in range(stages):
        count = base + (1 if stage < extra else 0)
        cuts.append(list(range(at, at + count)))
        at += count
    return cuts


def language_model(model: nn.Module) -> bool:
    return isinstance(model, ByteLlama)
