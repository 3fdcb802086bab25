"""The pieces of the training loop every strategy runs: timed optimizer steps and evaluation.

The shared loop (``training.engine``) and Hogwild's processes (``training.strategies.hogwild``)
both import these; neither imports the other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training.data.batching import DataShard
from training.data.datasets import AnySplit, Dataset, batch_to
from training.data.streaming import split_batches
from training.data.text import TextSplit, eval_starts
from training.observe.meter import StepTiming, finite
from training.process.runtime import Runtime, all_reduce_sum

# One optimizer step on a batch (images, labels); returns the loss, not yet read. Each strategy
# makes its own (training.strategies.common.step_default for most).
StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Tested = tuple[float | None, float]  # what evaluation finds: (test loss, test accuracy)


def steps_run(
    step: StepFn,
    data: Dataset,
    batches: Sequence[torch.Tensor],
    input_device: torch.device,
    label_device: torch.device | None = None,
    compile_clock: Callable[[], float] | None = None,
) -> Iterator[StepTiming]:
    """One optimizer step per batch of indices into ``data.train``, timed: the loop every
    strategy runs (Hogwild's processes too), public so that tests drive it as the engine does.
    The data time is the wait for the batch, from memory or from the DataLoader's workers;
    ``compile_clock`` (--compile) the seconds spent compiling so far, taken out of the step's
    compute time."""
    clock = time.perf_counter
    compiling = compile_clock or (lambda: 0.0)
    source = split_batches(data.train, batches)
    t0 = clock()
    for images, labels in source:
        x, y = batch_to(images, labels, input_device, data.mean, data.std, label_device)
        compiled_before = compiling()
        t1 = clock()
        loss = step(x, y)
        t2 = clock()
        compiled = compiling() - compiled_before
        yield StepTiming(loss, len(labels), t1 - t0, t2 - t1 - compiled, compiled)
        t0 = clock()


@torch.no_grad()
def evaluate(
    net: nn.Module,
    data: Dataset,
    rt: Runtime,
    batch_size: int,
    input_device: torch.device | None = None,
    label_device: torch.device | None = None,
    shard: DataShard | None = None,
) -> Tested:
    """Test loss (mean per image) and accuracy over the whole test split; a language model's
    over every byte of the held-out text it predicts (its accuracy: the next byte's).

    Each rank takes every world_size-th image (window), with no padding, and the sums are
    reduced, so the figures are exact for any number of ranks. Where ranks share a ``shard`` (a
    tensor-parallel group) each of them counts its images, losses and hits alike: the ratios
    stay exact.
    """
    input_device = rt.device if input_device is None else input_device
    label_device = input_device if label_device is None else label_device
    shard = shard or DataShard(rt.rank, rt.world_size)
    net.eval()
    mine = _eval_items(data.test, shard)
    loss_sum = torch.zeros((), dtype=torch.float64, device=label_device)
    correct = torch.zeros((), dtype=torch.int64, device=label_device)
    count = 0
    for images, labels in split_batches(data.test, mine.split(batch_size)):
        x, y = batch_to(images, labels, input_device, data.mean, data.std, label_device)
        logits = whole(net(x))
        loss_sum += F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="sum").to(
            torch.float64
        )
        correct += (logits.argmax(dim=-1) == y).sum()
        count += y.numel()
    total_loss, total_correct, total = all_reduce_sum(
        rt, [float(loss_sum.item()), float(correct.item()), float(count)]
    )
    if total == 0:  # refused before training where it can be known (training.data.images)
        raise ValueError("the test split is empty: there is nothing to evaluate on")
    return finite(total_loss / total), round(total_correct / total, 6)


def _eval_items(split: AnySplit, shard: DataShard) -> torch.Tensor:
    """This rank's share of the test split: its images' indices, or its windows' offsets."""
    if isinstance(split, TextSplit):
        return eval_starts(split, shard.rank, shard.count)
    return torch.arange(shard.rank, len(split), shard.count)


def whole(logits: torch.Tensor) -> torch.Tensor:
    """Logits as one tensor: tensor parallel's loss_parallel leaves them split by vocabulary
    (a DTensor), which every rank gathers here (evaluation and sampling are not its hot path)."""
    full = getattr(logits, "full_tensor", None)
    return full() if callable(full) else logits


SAMPLE_BYTES = 200  # what a language model writes at each evaluation
# Fewer, for tests that compare strategies and not the text: each byte is a forward, which under
# tensor parallel or the pipeline is a round of collectives (200 of them took 10 s of a 2-rank
# run on 2 loaded cores). A test's knob: nothing else sets it.
SAMPLE_BYTES_ENV = "TRAINYARD_SAMPLE_BYTES"


def sample_bytes() -> int:
    """How many bytes a language model writes at each evaluation: SAMPLE_BYTES, or a positive
    count in $TRAINYARD_SAMPLE_BYTES."""
    said = os.environ.get(SAMPLE_BYTES_ENV, "")
    return int(said) if said.isdigit() and int(said) > 0 else SAMPLE_BYTES


SAMPLE_TEMPERATURE = 0.8


@torch.no_grad()
def sample_text(
    net: nn.Module,
    prompt: torch.Tensor,
    *,
    device: torch.device,
    seed: int,
    length: int = SAMPLE_BYTES,
) -> str:
    """``length`` bytes a language model writes after ``prompt`` (its window, int64), drawn at
    temperature ``SAMPLE_TEMPERATURE`` from a generator seeded with ``seed``, as UTF-8 text
    (undecodable bytes replaced). Each byte is predicted from the last whole window, so every
    forward has the training's shape (sequence parallel splits it evenly), and every rank of a
    tensor-parallel group runs the same forwards and draws the same bytes."""
    net.eval()
    generator = torch.Generator().manual_seed(seed)
    window = prompt.to(torch.int64).cpu()
    written: list[int] = []
    for _ in range(length):
        logits = whole(net(window.view(1, -1).to(device)))
        probs = torch.softmax(logits[0, -1].float().cpu() / SAMPLE_TEMPERATURE, dim=-1)
        byte = torch.multinomial(probs, 1, generator=generator)
        written.append(int(byte))
        window = torch.cat([window[1:], byte])
    return bytes(written).decode("utf-8", errors="replace")
