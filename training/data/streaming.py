"""Batches from either data path, as uint8 images (B x C x H x W) and int64 labels on the CPU.

Resident splits are indexed; streaming ones are read by a ``torch.utils.data.DataLoader`` whose
``batch_sampler`` is the very list of index batches the resident path takes
(``training.data.batching.rank_batches``), so the order, the per-rank exactness and where a resumed
epoch continues are the same on both paths. Its workers (``--workers``, as pytorch/examples'
``-j``) decode ahead of the training step; one DataLoader per epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader

from training.data.datasets import AnySplit, Split
from training.data.text import TextSplit

PREFETCH = 2  # batches each worker decodes ahead (DataLoader's default)


def split_batches(
    split: AnySplit, batches: Sequence[torch.Tensor]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) of each batch of indices into ``split``, in order; a text split's
    batches are window offsets, its (inputs, next bytes)."""
    if isinstance(split, TextSplit):
        for starts in batches:
            yield split.windows(starts)
        return
    if isinstance(split, Split):
        for idx in batches:
            yield split.images.index_select(0, idx), split.labels.index_select(0, idx)
        return
    if not batches:
        return
    loader = DataLoader(
        split.reader,
        batch_sampler=[idx.tolist() for idx in batches],
        num_workers=split.workers,
        prefetch_factor=PREFETCH if split.workers else None,
    )
    for images, labels in loader:
        yield images, labels.to(torch.int64)
