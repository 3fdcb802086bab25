"""A plug-in's language model (``training.catalogue.model_language``: its ``build`` declares
``language = True``): built for windows of bytes, checked by one forward, and split by the plan it
declares instead of byte-llama's.

Its plan is torchtitan's kind: ``build.tensor_parallel(model)`` returns module path ->
``ParallelStyle`` (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``,
``PrepareModuleInput``, ...; "colwise"/"rowwise" stand for the plain two), applied with
``parallelize_module`` over the tensor-parallel mesh. The loss is taken under ``loss_parallel``,
so the plan may leave the logits split by vocabulary (``ColwiseParallel(output_layouts=Shard(-1),
use_local_output=False)`` on the output, as byte-llama's does) or whole.

Its pipeline cut is ``build.stages(model)``, its parts in order, as a classifier plug-in's
(``training.strategies.pipeline``: cut into stages balanced by parameters, nothing flattened
between them, checked against the model's own forward on windows of bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from training import catalogue
from training.text_catalogue import BYTE_VOCAB

STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
}


class PluginRefused(ValueError):
    """The plug-in's language model cannot be built or split as it declares; says why."""


def language_plugin_build(name: str, seq_len: int) -> nn.Module:
    """The plug-in's model for windows of ``seq_len`` bytes, checked by one forward: a window
    in, each position's logits over the byte values out."""
    point = catalogue.model_plugins()[name]
    try:
        model = point.load()(vocab_size=BYTE_VOCAB, seq_len=seq_len)
    except Exception as exc:
        why = f"the plug-in model {name} ({point.value}) failed to build: {exc}"
        raise PluginRefused(why) from exc
    if not isinstance(model, nn.Module):
        raise PluginRefused(
            f"the plug-in model {name} ({point.value}) returned {type(model).__name__}, not a "
            "torch.nn.Module"
        )
    if not any(p.is_meta for p in model.parameters()):  # the meta device runs no forward
        _probe(name, model, seq_len)
    return model


@torch.no_grad()
def _probe(name: str, model: nn.Module, seq_len: int) -> None:
    training = model.training
    model.eval()
    try:
        out = model(torch.zeros(1, seq_len, dtype=torch.int64))
    except Exception as exc:
        raise PluginRefused(f"the plug-in language model {name} fails on a window: {exc}") from exc
    finally:
        model.train(training)
    want = (1, seq_len, BYTE_VOCAB)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PluginRefused(
            f"the plug-in language model {name} maps a window of {seq_len} bytes to {got}, not "
            f"to {want} (each position's logits over the {BYTE_VOCAB} byte values)"
        )


def language_plugin_plan(name: str, model: nn.Module) -> dict[str, ParallelStyle]:
    """The plug-in's tensor-parallel plan for ``model``: module path -> style."""
    builder = getattr(catalogue.model_plugins()[name].load(), "tensor_parallel", None)
    declared: Any = builder(model) if callable(builder) else None
    if not isinstance(declared, dict) or not declared:
        raise PluginRefused(catalogue.no_tensor_plan_message(name))
    plan: dict[str, ParallelStyle] = {}
    for path, style in declared.items():
        made = STYLES[style]() if isinstance(style, str) and style in STYLES else style
        if not isinstance(made, ParallelStyle):
            raise PluginRefused(
                f"{name}'s tensor-parallel plan gives {path} {style!r}: not a ParallelStyle, "
                f"nor one of {', '.join(STYLES)}"
            )
        plan[str(path)] = made
    return plan


def plan_words(plan: dict[str, ParallelStyle]) -> str:
    """ "its plug-in's plan: layers.0.wq ColwiseParallel, layers.0.wo RowwiseParallel"."""
    return "its plug-in's plan: " + ", ".join(
        f"{path} {type(style).__name__}" for path, style in plan.items()
    )
