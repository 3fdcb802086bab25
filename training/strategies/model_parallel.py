"""``model-parallel``: the model split in two stages on two devices, activations moved between.

The stages are the model's top-level children (a plug-in may declare its own, see
``training.models.build.model_stages``), cut in two where their parameter counts are closest: the
built-in's are its convolutions (``features``) and its classifier. Each part goes to its stage's
device with a forward pre-hook that moves its inputs there, so the model's own forward runs as
written. The devices come from --gpus: two GPUs put one stage on each; one GPU puts the first
stage on it and the second on the CPU (PyTorch's multi-GPU examples mix CPU and GPU the same
way); without GPUs both stages are on the CPU, which runs but gives no parallelism, and the run
says so. Stages run one after the other for each batch (no pipelining), so this trades speed for
memory: each device holds only its stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn

from training.config import TrainConfig
from training.models.build import Part, model_stages, stages_balance
from training.process.runtime import Runtime
from training.protocol import Stage
from training.strategies.common import Plan, optimizer_make, step_default

BOTH_ON_CPU = (
    "Model parallelism needs devices to split over and no GPU was given, so both stages "
    "ran on the CPU, one after the other: no parallelism."
)


def stage_devices(cfg: TrainConfig) -> tuple[torch.device, torch.device]:
    if len(cfg.gpus) >= 2:
        return torch.device("cuda", cfg.gpus[0]), torch.device("cuda", cfg.gpus[1])
    if len(cfg.gpus) == 1:
        return torch.device("cuda", cfg.gpus[0]), torch.device("cpu")
    return torch.device("cpu"), torch.device("cpu")


def _inputs_to(
    device: torch.device, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A forward pre-hook: a part's tensor inputs moved to its stage's device."""
    move: Callable[[Any], Any] = partial(_to, device)
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def _to(device: torch.device, value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device != device:
        # A copy off a GPU must be synchronous: the CPU would otherwise read it unfinished.
        return value.to(device, non_blocking=value.device.type == "cpu")
    return value


def stages_place(
    model: nn.Module, stages: tuple[list[Part], list[Part]], devices: tuple[torch.device, ...]
) -> None:
    """Put each part on its stage's device, with a hook that moves its inputs there: the
    model's own forward runs unchanged, and its state dict (checkpoints) keeps its keys.
    Parameters of the model itself, outside its parts, go with the first stage."""
    model.to(devices[0])
    for parts, device in zip(stages, devices, strict=True):
        for _, module in parts:
            module.to(device)
            module.register_forward_pre_hook(partial(_inputs_to, device), with_kwargs=True)


def stage_table(stages: Sequence[list[Part]], labels: list[str]) -> list[Stage]:
    """started.stages: each stage's parts (children) and device."""
    table: list[Stage] = []
    for parts, label in zip(stages, labels, strict=True):
        names = [name for name, _ in parts]
        table.append(
            {
                "name": names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}",
                "device": label,
                "children": names,
                "parameters": sum(p.numel() for _, m in parts for p in m.parameters()),
            }
        )
    return table


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    stages = stages_balance(model_stages(cfg.model, model))
    first, second = stage_devices(cfg)
    stages_place(model, stages, (first, second))
    # After placing the stages: a resumed optimizer state follows each parameter's device.
    optimizer = optimizer_make(cfg, model)
    labels = [str(first), str(second)]
    notes = [BOTH_ON_CPU] if not cfg.gpus else []
    return Plan(
        model=model,
        net=model,
        eval_net=model,
        optimizer=optimizer,
        step=step_default(model, optimizer),
        input_device=first,
        output_device=second,
        devices=labels,
        notes=notes,
        warnings=list(notes),
        started={"stages": stage_table(stages, labels)},
    )
