"""Which images make up each batch: one seeded order per epoch, shared by every strategy.

Every strategy draws from the same global order: a permutation of the training split seeded with
``seed + epoch`` (so a resumed run sees what an uninterrupted one would), cut into global batches
of ``batch_size x world_size`` images. Rank ``r`` of ``world_size`` takes the ``r``-th contiguous
slice of each global batch. Hence DDP with 2 ranks of 32 is fed exactly the two halves of the
batches of 64 that a single process with ``--batch-size 64`` trains on, which is what makes DDP
checkable for exactness (tests/test_exactness.py) rather than merely "close"; Hogwild's processes
take their shard the same way. Ranks that train on one batch together (a tensor-parallel group)
take one slice between them (``DataShard``): --batch-size is then per group.

With ``--accumulate K`` one optimizer step takes K batches per rank: the global batch of a step
is ``batch_size x K x world_size`` images, rank ``r`` takes its contiguous slice of it as above,
and its step cuts that slice into K micro-batches (``training.strategies.common.step_default``).
So DDP with ``--accumulate 4`` and batches of 16 trains on the very images, in the very ranks,
that DDP with batches of 64 does; only the memory a forward holds is a quarter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DataShard:
    """Which slice of each global batch, and of the test split, a rank takes: slice ``rank`` of
    ``count``. Each rank its own (its rank of the world) where ranks split the data only; where
    they split the model's layers (tensor parallel) the ranks of one group train on one batch
    together, so they share a slice and ``count`` is the number of groups."""

    rank: int
    count: int


def epoch_order(num_images: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of ``range(num_images)`` used in ``epoch`` (1-based)."""
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_images, generator=generator)


def global_batches(
    num_images: int,
    global_batch_size: int,
    seed: int,
    epoch: int,
    world_size: int = 1,
    accumulate: int = 1,
) -> list[torch.Tensor]:
    """The epoch's global batches (one per optimizer step), in order.

    A short last batch that would give some rank's micro-batches fewer than two images is
    dropped (fewer than one where the batch size is 1): an empty batch has no mean loss, and
    BatchNorm (every torchvision ResNet) cannot train on a batch of one image ("Expected more
    than 1 value per channel"), which a folder of N x 64 + 1 images would otherwise end each
    epoch with.
    """
    batches = list(epoch_order(num_images, seed, epoch).split(global_batch_size))
    if batches and len(batches[-1]) < last_batch_min(global_batch_size, world_size, accumulate):
        batches.pop()
    return batches


def last_batch_min(global_batch_size: int, world_size: int, accumulate: int = 1) -> int:
    """The fewest images a short last global batch keeps (``global_batches``): two per
    micro-batch of every rank, or one where the batch size is 1. So every rank cuts its slice
    into ``accumulate`` non-empty micro-batches, as many as every other rank (FSDP2 gathers
    parameters in each forward: the ranks' forwards must pair up)."""
    pieces = world_size * accumulate
    return pieces * min(2, max(1, global_batch_size // pieces))


def rank_batches(
    num_images: int,
    batch_size: int,
    world_size: int,
    rank: int,
    seed: int,
    epoch: int,
    accumulate: int = 1,
) -> list[torch.Tensor]:
    """Rank ``rank``'s share of each optimizer step: its contiguous slice of each global batch,
    ``batch_size x accumulate`` images (the step cuts it into ``accumulate`` micro-batches).

    Full global batches split into equal slices; a short last one is split as evenly as it goes
    (sizes differ by at most one), so every rank takes the same number of steps.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    global_size = batch_size * accumulate * world_size
    return [
        batch.tensor_split(world_size)[rank]
        for batch in global_batches(num_images, global_size, seed, epoch, world_size, accumulate)
    ]


def steps_per_epoch(
    num_images: int, batch_size: int, world_size: int, limit: int | None, accumulate: int = 1
) -> int:
    """Optimizer steps each rank takes per epoch, after ``--steps-per-epoch`` (``limit``): each
    takes ``accumulate`` batches."""
    global_size = batch_size * accumulate * world_size
    full, rest = divmod(num_images, global_size)
    count = full + (1 if rest >= last_batch_min(global_size, world_size, accumulate) else 0)
    return count if limit is None else min(count, limit)
