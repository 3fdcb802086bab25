"""``python -m training.bench engine``: how fast the engine's data path feeds training.

Three loops train the same model (``--model``, SimpleCNN by default; same initial weights,
Adam), with the same batch size, thread count and number of steps, in one process:

ours        the engine's own loop (``training.loop.steps_run`` with the strategies' step and
            the engine's per-step accounting): uint8 tensors resident in memory, batches taken
            by indexing and normalised on the fly.
dataloader  a pytorch/examples-style loop: ``torchvision.datasets.MNIST`` (or FashionMNIST),
            read from the IDX files the data module wrote, with ``ToTensor()`` and
            ``Normalize()`` per image, through a ``DataLoader`` (shuffled; ``--workers``, 0 by
            default, as the examples use on the CPU).
compute     compute only: the same normalised batches built beforehand, already in memory; no
            data work at all. The ceiling for any data path.

The loops alternate (ours, dataloader, compute, ours, ...) for ``--rounds`` rounds of ``--steps``
steps each, after a few warm-up steps, so that the machine's noise falls on all of them alike.
For each loop the table shows the median images/s over the rounds; the ratios are medians of the
per-round ratios (each round's loops ran back to back). The last line, ``engine ratio``, is
ours / compute-only: 1.0 means the data path costs nothing.

A second workload (``--workload imagefolder``, or ``both``, the default, which runs it first)
trains on an image folder of real images written out as PNG files: the engine's resident and
streaming paths beside a plain ``ImageFolder`` + ``DataLoader`` loop, measured the same way
(``training.bench.imagefolder``); its last line is ``imagefolder ratio``, streaming / plain.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.datasets import MNIST, FashionMNIST

from training.bench import imagefolder
from training.catalogue import IMAGEFOLDER, MODEL_DEFAULT
from training.data.batching import rank_batches
from training.data.datasets import Dataset, DatasetMeta, batch_to, dataset_meta, load_dataset
from training.data.idx_files import DEBIAN_FASHION_DIR, dataset_files
from training.data.streaming import split_batches
from training.loop import StepFn, steps_run
from training.models.build import model_build_for
from training.observe.meter import Window
from training.process.allocator import allocator_tune
from training.strategies.common import step_default

WARMUP_STEPS = 3
LOOPS = ("ours", "dataloader", "compute")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training.bench engine", description=__doc__)
    p.add_argument(
        "--dataset",
        choices=("mnist", "fashion-mnist"),
        default="fashion-mnist" if DEBIAN_FASHION_DIR.is_dir() else "mnist",
        help="default: fashion-mnist where Debian's package is installed, else the MNIST sample",
    )
    p.add_argument(
        "--data-dir", default=os.environ.get("TRAINYARD_DATA_DIR") or "./var/data", type=Path
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=40, help="timed steps per loop and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workload", choices=("both", "idx", "imagefolder"), default="both")
    p.add_argument(
        "--model",
        default=MODEL_DEFAULT,
        help="the model every loop trains: any name of python -m training.catalogue "
        f"(default: {MODEL_DEFAULT})",
    )
    p.add_argument(
        "--folder-workers",
        type=int,
        default=2,
        help="DataLoader workers of the image-folder workload's streaming and plain loops",
    )
    p.add_argument(
        "--folder-per-class",
        type=int,
        default=imagefolder.PER_CLASS,
        help="training images per class in the image folder (a fifth as many for val)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    # As python -m training does; it applies to all loops alike.
    tuned = allocator_tune()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    malloc = "tuned as in training.process.allocator" if tuned else "as the environment sets it"
    if args.workload in ("both", "imagefolder"):
        _folder_workload(args, device, malloc)
    if args.workload in ("both", "idx"):
        _idx_workload(args, device, malloc)
    return 0


def _idx_workload(args: argparse.Namespace, device: torch.device, malloc: str) -> None:
    data = load_dataset(args.dataset, args.data_dir.expanduser().resolve())
    files = dataset_files(args.dataset, args.data_dir.expanduser().resolve())
    loops = {
        "ours": _ours(data, args.batch_size, args.seed, device),
        "dataloader": _dataloader(files.raw, args, data.mean, data.std, device),
        "compute": _compute(data, args.batch_size, args.seed, device),
    }
    meta = dataset_meta(args.dataset, args.data_dir.expanduser().resolve(), None)
    rates = rounds_run(loops, args, device, meta)
    print(
        f"engine benchmark: {data.source}; {args.model}, Adam, batch {args.batch_size}, "
        f"{args.threads} thread(s), device {device}, {args.rounds} round(s) of {args.steps} "
        f"steps per loop, alternating {' / '.join(LOOPS)}; malloc {malloc}"
    )
    rates_print(rates)
    vs_loader = _paired(rates["ours"], rates["dataloader"])
    vs_compute = _paired(rates["ours"], rates["compute"])
    print(f"ours / dataloader loop:   {vs_loader:.3f}")
    print(f"ours / compute-only loop: {vs_compute:.3f}")
    print(f"engine ratio: {vs_compute:.3f}")


def _folder_workload(args: argparse.Namespace, device: torch.device, malloc: str) -> None:
    data_dir = args.data_dir.expanduser().resolve()
    root, what = imagefolder.folder_ready(data_dir, args.dataset, args.folder_per_class)
    loops, _ = imagefolder.loops_make(args, root, device)
    rates = rounds_run(loops, args, device, dataset_meta(IMAGEFOLDER, data_dir, str(root)))
    print(
        f"image-folder benchmark: {what}; {args.model}, Adam, batch {args.batch_size}, "
        f"{args.threads} thread(s), {args.folder_workers} DataLoader worker(s), device {device}, "
        f"{args.rounds} round(s) of {args.steps} steps per loop, alternating "
        f"{' / '.join(loops)}; malloc {malloc}"
    )
    rates_print(rates)
    print(f"resident / imagefolder loop:  {_paired(rates['resident'], rates['imagefolder']):.3f}")
    print(f"streaming / resident:         {_paired(rates['streaming'], rates['resident']):.3f}")
    print(f"imagefolder ratio: {_paired(rates['streaming'], rates['imagefolder']):.3f}")


def rounds_run(
    loops: dict[str, Loop], args: argparse.Namespace, device: torch.device, meta: DatasetMeta
) -> dict[str, list[float]]:
    """images/s of each loop per round: the loops alternate, each on its own copy of the model
    (same initial weights, built for the workload's data as a run builds it), after a warm-up."""
    models = {}
    for name in loops:
        torch.manual_seed(args.seed)
        model = model_build_for(name=args.model, meta=meta).model.to(device)
        models[name] = step_default(model, torch.optim.Adam(model.parameters(), lr=1e-3)), model
    for name, loop in loops.items():  # warm-up: first-step allocations, lazy initialisation
        loop(models[name][0], WARMUP_STEPS)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            models[name][1].train()
            _sync(device)
            t0 = time.perf_counter()
            images = loop(models[name][0], args.steps)
            _sync(device)
            rates[name].append(images / (time.perf_counter() - t0))
    return rates


def rates_print(rates: dict[str, list[float]]) -> None:
    print(f"{'loop':<12} {'median img/s':>13}  per round")
    for name, per in rates.items():
        per_round = " ".join(f"{r:8.1f}" for r in per)
        print(f"{name:<12} {statistics.median(per):13.1f}  {per_round}")


Loop = Callable[[StepFn, int], int]  # (step, steps) -> images trained on


def _ours(data: Dataset, batch_size: int, seed: int, device: torch.device) -> Loop:
    batches = _cycle_batches(len(data.train), batch_size, seed)

    def run(step: StepFn, steps: int) -> int:
        # As engine.epoch_run: steps_run plus the per-step accounting the events are made of.
        window = Window(device)
        for timing in steps_run(step, data, list(itertools.islice(batches, steps)), device):
            window.add(timing)
        window.row()  # reads the loss once, as a step event does
        return window.images

    return run


def _dataloader(
    raw: Path,
    args: argparse.Namespace,
    mean: Sequence[float],
    std: Sequence[float],
    device: torch.device,
) -> Loop:
    cls = FashionMNIST if args.dataset == "fashion-mnist" else MNIST
    dataset = cls(
        str(raw.parent.parent),  # torchvision's root: <root>/<class name>/raw
        train=True,
        download=False,
        transform=transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize(list(mean), list(std))]
        ),
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    return _batches_loop(_forever(loader), device)


def _compute(data: Dataset, batch_size: int, seed: int, device: torch.device) -> Loop:
    # Enough distinct batches that caches do not flatter it; built once, before timing.
    ready = [
        batch_to(x, y, device, data.mean, data.std)
        for x, y in split_batches(
            data.train, rank_batches(len(data.train), batch_size, 1, 0, seed, 1)[:64]
        )
    ]
    return _batches_loop(itertools.cycle(ready), None)


def _batches_loop(
    stream: Iterator[tuple[torch.Tensor, torch.Tensor]], device: torch.device | None
) -> Loop:
    """Steps on the (images, labels) batches of ``stream``, moved to ``device`` first (None:
    they are there already, and the loop does nothing but compute)."""

    def run(step: StepFn, steps: int) -> int:
        images = 0
        last = None
        for x, y in itertools.islice(stream, steps):
            if device is not None:
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            last = step(x, y)
            images += len(y)
        if last is not None:
            last.item()
        return images

    return run


def _cycle_batches(n: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    for epoch in itertools.count(1):
        yield from rank_batches(n, batch_size, 1, 0, seed, epoch)


def _forever(
    loader: DataLoader[tuple[torch.Tensor, int]],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from loader


def _paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
