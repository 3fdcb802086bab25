"""Checkpoints of a model whose parameters are ``DTensor`` shards (FSDP2, tensor parallel, both),
in the plain model's format.

At a checkpoint every rank joins the gathers (collectives); rank 0 receives the whole model and
optimizer state (``torch.distributed.checkpoint.state_dict``, full and offloaded to the CPU), the
optimizer's keyed by parameter number as a torch optimizer's is. So such a checkpoint resumes
under ``single`` or ``ddp``, and theirs under these strategies: the model is split after the
checkpoint's weights are loaded (``training.epochs.model_build``), and the optimizer state is
set back here, each rank taking its own shards of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypedDict

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from training.checkpoint import holds_torch_optimizer
from training.config import TrainConfig
from training.process.runtime import Runtime
from training.strategies.common import Plan, plan_simple

# Gathered whole, on rank 0 only, in host memory: what a plain model's checkpoint holds.
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def plan_sharded(cfg: TrainConfig, rt: Runtime, model: nn.Module, **extra: Any) -> Plan:
    """The plan of a model already split into ``DTensor`` shards on ``rt.device``: its optimizer
    made now (it steps the shards, so its state is sharded too), its checkpoints gathered."""
    plan = plan_simple(cfg, model, model, rt.device, **extra)
    return dataclasses.replace(plan, **full_state_hooks(cfg, rt, model, plan.optimizer))


class FullStateHooks(TypedDict):
    """The ``Plan`` fields that gather and restore a sharded model's state."""

    model_gather: Callable[[], dict[str, Any] | None]
    optimizer_gather: Callable[[], dict[str, Any] | None]
    optimizer_restore: Callable[[dict[str, Any]], str]


def full_state_hooks(
    cfg: TrainConfig, rt: Runtime, model: nn.Module, optimizer: torch.optim.Optimizer
) -> FullStateHooks:
    """A Plan's ``model_gather``, ``optimizer_gather`` and ``optimizer_restore`` for ``model``."""
    return FullStateHooks(
        model_gather=lambda: model_gather(model, rt),
        optimizer_gather=lambda: optimizer_gather(model, optimizer, rt),
        optimizer_restore=lambda saved: optimizer_restore(cfg, model, optimizer, saved),
    )


def model_gather(model: nn.Module, rt: Runtime) -> dict[str, Any] | None:
    """The whole model's state on rank 0 (None on the others): a collective."""
    state = get_model_state_dict(model, options=_FULL)
    return state if rt.is_main else None


def optimizer_gather(
    model: nn.Module, optimizer: torch.optim.Optimizer, rt: Runtime
) -> dict[str, Any] | None:
    """The whole optimizer state on rank 0, as the plain model's optimizer would hold it."""
    state = get_optimizer_state_dict(model, optimizer, options=_FULL)
    return by_number(state, _names(model)) if rt.is_main else None


def optimizer_restore(
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
