"""The training loop shared by every strategy."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data.distributed import DistributedSampler

from training import checkpoint
from training.config import TrainConfig
from training.data import Dataset, Split, load_dataset, to_batch
from training.model import SimpleCNN
from training.protocol import EventWriter
from training.runtime import Runtime, all_gather, all_reduce_sum

log = logging.getLogger(__name__)

DP_WITHOUT_GPUS = (
    "DataParallel needs GPUs and none were found, so this run ran as a single CPU process "
    "with no parallelism."
)


class _Indices(TorchDataset[int]):
    """Stands in for the dataset in DistributedSampler, which only needs its length."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


@dataclass
class _Meter:
    """Loss and image counts since the last report; the loss stays on the device until read,
    so a CUDA step does not wait for the GPU."""

    device: torch.device
    loss_sum: torch.Tensor = field(init=False)
    steps: int = 0
    images: int = 0
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)

    def add(self, loss: torch.Tensor, images: int) -> None:
        self.loss_sum += loss.detach().to(torch.float64)
        self.steps += 1
        self.images += images

    def reduce(self, rt: Runtime) -> tuple[float | None, float]:
        """(mean loss over all ranks' steps, images per second over all ranks)."""
        loss_sum, steps, images = all_reduce_sum(
            rt, [float(self.loss_sum.item()), float(self.steps), float(self.images)]
        )
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return _finite(loss_sum / steps if steps else math.nan), round(images / elapsed, 1)


def train(cfg: TrainConfig, rt: Runtime, events: EventWriter) -> None:
    t_start = time.monotonic()
    # Same seed on every rank: identical initial weights (DDP also broadcasts rank 0's).
    torch.manual_seed(cfg.seed)
    model = SimpleCNN().to(rt.device)
    optimizer = _make_optimizer(cfg, model)
    notes: list[str] = []
    start_epoch, step = 1, 0
    if cfg.resume:
        start_epoch, step = _resume(cfg, model, optimizer)
        notes.append(
            f"Resumed from {cfg.resume} at epoch {start_epoch - 1}, step {step}; "
            f"training continues with epoch {start_epoch}."
        )
    # After the checkpoint: a bad --resume fails before seconds are spent on the data.
    data = load_dataset(cfg.dataset, Path(cfg.data_dir))
    net, warnings = _wrap(cfg, rt, model, notes)

    sampler: DistributedSampler[int] | None = None
    if rt.distributed:
        sampler = DistributedSampler(
            _Indices(len(data.train)),
            num_replicas=rt.world_size,
            rank=rt.rank,
            shuffle=True,
            seed=cfg.seed,
        )
    per_rank = len(sampler) if sampler is not None else len(data.train)
    steps_per_epoch = 1 if cfg.dry_run else math.ceil(per_rank / cfg.batch_size)
    ranks = all_gather(rt, (os.getpid(), rt.device_label))

    events.emit(
        "started",
        strategy=cfg.strategy,
        world_size=rt.world_size,
        device=rt.device_label,
        devices=_devices(cfg, ranks),
        dataset=cfg.dataset,
        dataset_source=data.source,
        train_size=len(data.train),
        test_size=len(data.test),
        epochs=cfg.epochs,
        start_epoch=start_epoch,
        batch_size=cfg.batch_size,
        global_batch_size=cfg.batch_size * rt.world_size,
        steps_per_epoch=steps_per_epoch,
        total_steps=steps_per_epoch * cfg.epochs,
        optimizer=cfg.optimizer,
        lr=cfg.lr,
        seed=cfg.seed,
        dry_run=cfg.dry_run,
        pids=[pid for pid, _ in ranks],
        # Under torchrun the ranks' parent is the launcher, the process the caller started.
        launcher_pid=os.getppid() if rt.distributed else os.getpid(),
        notes=notes,
        torch_version=torch.__version__,
    )
    _log(events, rt, f"Data: {data.source}.", "warning" if data.substitute else "info")
    for message in warnings:
        _log(events, rt, message, "warning")
    if start_epoch > cfg.epochs:
        _log(events, rt, f"The checkpoint already covers {cfg.epochs} epoch(s); nothing to train.")

    eval_net = net if cfg.strategy == "dp" else model
    test_loss, test_accuracy = None, 0.0
    for epoch in range(start_epoch, cfg.epochs + 1):
        step, train_loss, ips = _train_epoch(
            cfg, rt, events, net, optimizer, data, sampler, epoch, step, steps_per_epoch
        )
        test_loss, test_accuracy = evaluate(eval_net, data, rt, cfg.test_batch_size)
        events.emit(
            "epoch",
            epoch=epoch,
            step=step,
            train_loss=train_loss,
            test_loss=test_loss,
            test_accuracy=test_accuracy,
            images_per_second=ips,
        )
        if rt.is_main:
            log.info("epoch %d: test loss %s, accuracy %.4f", epoch, test_loss, test_accuracy)
        if cfg.checkpoint_dir and rt.is_main:
            path = checkpoint.save(
                Path(cfg.checkpoint_dir),
                model=model,
                optimizer=optimizer,
                epoch=epoch,
                step=step,
                config=cfg.to_dict(),
            )
            events.emit("checkpoint", epoch=epoch, step=step, path=str(path))
    if start_epoch > cfg.epochs:
        test_loss, test_accuracy = evaluate(eval_net, data, rt, cfg.test_batch_size)
    events.emit(
        "finished",
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        epochs=cfg.epochs,
        epochs_run=max(0, cfg.epochs - start_epoch + 1),
        steps=step,
        duration=round(time.monotonic() - t_start, 3),
    )


def _train_epoch(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Dataset,
    sampler: DistributedSampler[int] | None,
    epoch: int,
    step: int,
    steps_per_epoch: int,
) -> tuple[int, float | None, float]:
    """One pass over this rank's share; returns (global step, epoch loss, images/s)."""
    if sampler is not None:
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.int64)
    else:
        # Seeded per epoch, so a resumed run sees the order an uninterrupted one would.
        order = torch.randperm(
            len(data.train), generator=torch.Generator().manual_seed(cfg.seed + epoch)
        )
    batches = order.split(cfg.batch_size)[:steps_per_epoch]
    net.train()
    interval, whole = _Meter(rt.device), _Meter(rt.device)
    for i, idx in enumerate(batches):
        x, y = to_batch(data.train, idx, rt.device, data.mean, data.std)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        interval.add(loss, len(idx))
        whole.add(loss, len(idx))
        if step % cfg.log_interval == 0 or i == len(batches) - 1:
            # Every rank takes this branch at the same step: the all_reduce inside matches up.
            train_loss, ips = interval.reduce(rt)
            events.emit(
                "step", epoch=epoch, step=step, train_loss=train_loss, images_per_second=ips
            )
            interval = _Meter(rt.device)
    epoch_loss, epoch_ips = whole.reduce(rt)
    return step, epoch_loss, epoch_ips


@torch.no_grad()
def evaluate(
    net: nn.Module, data: Dataset, rt: Runtime, batch_size: int
) -> tuple[float | None, float]:
    """Test loss (mean per image) and accuracy over the whole test split.

    Each rank takes every world_size-th image, with no padding, and the sums are reduced, so
    the figures are exact for any number of ranks.
    """
    net.eval()
    test: Split = data.test
    mine = torch.arange(rt.rank, len(test), rt.world_size)
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    correct = torch.zeros((), dtype=torch.int64, device=rt.device)
    for idx in mine.split(batch_size):
        x, y = to_batch(test, idx, rt.device, data.mean, data.std)
        logits = net(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").to(torch.float64)
        correct += (logits.argmax(dim=1) == y).sum()
    total_loss, total_correct, total = all_reduce_sum(
        rt, [float(loss_sum.item()), float(correct.item()), float(len(mine))]
    )
    return _finite(total_loss / total), round(total_correct / total, 6)


def _make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


def _resume(
    cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[int, int]:
    assert cfg.resume is not None
    state = checkpoint.load(Path(cfg.resume))
    saved: dict[str, Any] = state.get("config", {})
    if saved.get("optimizer", cfg.optimizer) != cfg.optimizer:
        raise ValueError(
            f"the checkpoint was trained with --optimizer {saved['optimizer']}; "
            f"resume with the same optimizer (got --optimizer {cfg.optimizer})"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    # The saved learning rate would silently override --lr.
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr
    checkpoint.restore_rng(state)
    return int(state["epoch"]) + 1, int(state["step"])


def _wrap(
    cfg: TrainConfig, rt: Runtime, model: nn.Module, notes: list[str]
) -> tuple[nn.Module, list[str]]:
    """The module to train, per strategy; appends notes, returns warnings to log."""
    warnings: list[str] = []
    if cfg.strategy == "dp":
        if cfg.gpus:
            net: nn.Module = nn.DataParallel(
                model, device_ids=list(cfg.gpus), output_device=cfg.gpus[0]
            )
            if len(cfg.gpus) == 1:
                notes.append(
                    "DataParallel over one GPU gives no parallelism; list more with --gpus."
                )
            return net, warnings
        if torch.cuda.is_available():
            raise RuntimeError("--strategy dp on a machine with GPUs needs --gpus")
        # Without a GPU, DataParallel keeps device_ids empty and just calls the module.
        net = nn.DataParallel(model)
        notes.append(DP_WITHOUT_GPUS)
        warnings.append(DP_WITHOUT_GPUS)
        return net, warnings
    if cfg.strategy == "ddp":
        if rt.device.type == "cuda":
            return DistributedDataParallel(model, device_ids=[rt.device.index]), warnings
        notes.append(
            f"DistributedDataParallel ran {rt.world_size} CPU process(es) over gloo, each with "
            f"{torch.get_num_threads()} thread(s) and a batch of {cfg.batch_size}, so one step "
            f"covers {cfg.batch_size * rt.world_size} images."
        )
        return DistributedDataParallel(model), warnings
    if len(cfg.gpus) > 1:
        notes.append(
            f"The single strategy uses one device, {rt.device_label}; the other GPUs given "
            "were not used."
        )
    return model, warnings


def _devices(cfg: TrainConfig, ranks: list[tuple[int, str]]) -> list[str]:
    if cfg.strategy == "dp" and cfg.gpus:
        return [f"cuda:{g}" for g in cfg.gpus]
    return [label for _, label in ranks]


def _finite(value: float) -> float | None:
    # JSON has no NaN or Infinity; a diverged loss is reported as null.
    return round(value, 6) if math.isfinite(value) else None


def _log(events: EventWriter, rt: Runtime, message: str, level: str = "info") -> None:
    if rt.is_main:
        log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", message)
    events.log(message, level)
