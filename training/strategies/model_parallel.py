"""``model-parallel``: the model split in two stages on two devices, activations moved between.

Stage 1 is the convolutions (``features``), stage 2 the classifier. The devices come from
--gpus: two GPUs put one stage on each; one GPU puts the convolutions, where most of the compute
is, on it and the classifier on the CPU (PyTorch's multi-GPU examples mix CPU and GPU the same
way); without GPUs both stages are on the CPU, which runs but gives no parallelism, and the run
says so. Stages run one after the other for each batch (no pipelining), so this trades speed for
memory: each device holds only its stage.
"""

from __future__ import annotations

import torch
from torch import nn

from training.config import TrainConfig
from training.model import SimpleCNN
from training.runtime import Runtime
from training.strategies.common import Plan, optimizer_make, step_default

BOTH_ON_CPU = (
    "Model parallelism needs devices to split over and no GPU was given, so both stages "
    "(convolutions and classifier) ran on the CPU, one after the other: no parallelism."
)


class TwoStageCNN(nn.Module):
    """SimpleCNN's ``features`` on one device, its ``classifier`` on another.

    The submodules are the model's own, so the bare model's state dict (checkpoints) is
    unchanged and any strategy can resume it.
    """

    def __init__(self, model: SimpleCNN, first: torch.device, second: torch.device) -> None:
        super().__init__()
        self.first, self.second = first, second
        self.features = model.features.to(first)
        self.classifier = model.classifier.to(second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x.to(self.first, non_blocking=True))
        # A copy off a GPU must be synchronous: the CPU would otherwise read it unfinished.
        h = h.to(self.second, non_blocking=self.first.type == "cpu")
        out: torch.Tensor = self.classifier(h)
        return out


def stage_devices(cfg: TrainConfig) -> tuple[torch.device, torch.device]:
    if len(cfg.gpus) >= 2:
        return torch.device("cuda", cfg.gpus[0]), torch.device("cuda", cfg.gpus[1])
    if len(cfg.gpus) == 1:
        return torch.device("cuda", cfg.gpus[0]), torch.device("cpu")
    return torch.device("cpu"), torch.device("cpu")


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    assert isinstance(model, SimpleCNN)
    first, second = stage_devices(cfg)
    net = TwoStageCNN(model, first, second)
    # After placing the stages: a resumed optimizer state follows each parameter's device.
    optimizer = optimizer_make(cfg, model)
    labels = [str(first), str(second)]
    notes = [BOTH_ON_CPU] if not cfg.gpus else []
    return Plan(
        model=model,
        net=net,
        eval_net=net,
        optimizer=optimizer,
        step=step_default(net, optimizer),
        input_device=first,
        output_device=second,
        devices=labels,
        notes=notes,
        warnings=list(notes),
        started={
            "stages": [
                {"name": "features", "device": labels[0]},
                {"name": "classifier", "device": labels[1]},
            ]
        },
    )
