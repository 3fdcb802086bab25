"""The built-in network, ``simple-cnn`` (``training.models.build`` builds it and every other)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

POOLED_SIDE = 14  # the feature map's side for images over 28x28


class SimpleCNN(nn.Module):
    """Two 3x3 convolutions, one 2x2 max-pool, two linear layers.

    The defaults are MNIST's (1 channel, 28x28, 10 classes); the first linear layer's width
    follows ``image_size`` up to 28 (the state dict at the defaults is the one checkpoints
    always held). Larger images are pooled to 14x14 after the convolutions: at 224x224 the
    first linear layer would otherwise hold 103M weights.

    ``tensor_parallel_plan`` is its plan for tensor parallel (``training.models.build``): the
    classifier's first linear layer split by output features (column-wise), the second by input
    features (row-wise), so the hidden activations stay split between them and one all-reduce
    a forward joins the logits. Its hidden width, 128, divides over 2, 4, 8, ... ranks; the
    convolutions (under 2% of the weights at 28x28) are replicated.
    """

    tensor_parallel_plan: ClassVar[dict[str, str]] = {
        "classifier.1": "colwise",
        "classifier.3": "rowwise",
    }

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        if image_size < 2:
            raise ValueError(f"simple-cnn needs images of at least 2x2 pixels, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 2
        if side > POOLED_SIDE:
            self.features.append(nn.AdaptiveAvgPool2d(POOLED_SIDE))  # no weights: keys unchanged
            side = POOLED_SIDE
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side**2, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
