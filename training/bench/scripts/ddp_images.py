"""The benchmark's user script (``python -m training.bench script``): DDP over Gloo, a small CNN
on Fashion-MNIST's first images (Debian's dataset-fashion-mnist; the MNIST sample's files where
given with --data), `run.log` of five figures every step and `should_stop()` every step, as a
user's script under Trainyard does. Prints its images/s over the steps after --warmup: every
rank's images together, measured on rank 0 between two barriers."""

import argparse
import gzip
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import trainyard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
run = trainyard.init()
count = args.batch_size * world * 8
with gzip.open(Path(args.data) / "train-images-idx3-ubyte.gz") as f:
    pixels = np.frombuffer(f.read(), np.uint8, offset=16)[: count * 784]
with gzip.open(Path(args.data) / "train-labels-idx1-ubyte.gz") as f:
    labels = torch.from_numpy(np.frombuffer(f.read(), np.uint8, offset=8)[:count].astype(np.int64))
images = torch.from_numpy(pixels.copy()).float().div(255).view(count, 1, 28, 28)

torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(
    nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(),
    nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
))  # fmt: skip
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
batches = count // (args.batch_size * world)
began = 0.0
for step in range(1, args.steps + 1):
    if step == args.warmup + 1:
        dist.barrier()
        began = time.perf_counter()
    at = ((step % batches) * world + rank) * args.batch_size
    x, y = images[at : at + args.batch_size], labels[at : at + args.batch_size]
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    accuracy = (logits.argmax(1) == y).float().mean().item()
    run.log({"loss": loss.item(), "accuracy": accuracy, "lr": 0.05, "batch": float(at),
             "grad_norm": float(model.module[0].weight.grad.norm())}, step=step)  # fmt: skip
    if run.should_stop():
        break
dist.barrier()
seconds = time.perf_counter() - began
if rank == 0:
    measured = (args.steps - args.warmup) * args.batch_size * world
    print(f"images/s {measured / seconds:.1f}", flush=True)
run.finish()
dist.destroy_process_group()
