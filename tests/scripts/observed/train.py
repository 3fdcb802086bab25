"""A user's script with no Trainyard line in it: a small CNN on Fashion-MNIST through a
DataLoader, over Gloo, wrapped in DDP (--wrap ddp) or sharded by FSDP2 (--wrap fsdp: each layer
with parameters, then the root), SGD. The observer (training/scripts/observer.py) must find its
steps, phases and collectives on its own. Rank 0 prints every rank's images/s after --warmup
steps (python -m training.bench observe reads it). --device cuda puts each rank's model and
batches on its own GPU (cuda:LOCAL_RANK) over NCCL (.ci/gpu-check's script-observer row).
--pause STEP:SECONDS hangs rank 1 before that step for that long (the stall test's)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fashion import fashion
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--wrap", choices=("ddp", "fsdp", "none"), default="ddp")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--images", type=int, default=2048)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--warmup", type=int, default=5, help="steps before images/s is measured")
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
parser.add_argument(
    "--pause",
    action="append",
    default=[],
    metavar="STEP:SECONDS",
    help="rank 1 sleeps before that step's forward (the stall test's)",
)
args = parser.parse_args()
PAUSES = {int(at): float(seconds) for at, seconds in (p.split(":") for p in args.pause)}


def wait_for_nothing(seconds: float) -> None:
    """A hung rank, as the stall test makes one: its stack names this function."""
    time.sleep(seconds)


if args.device == "cuda":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
torch.manual_seed(0)
x, y = fashion(args.images)
data = TensorDataset(x, y)
loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
net = nn.Sequential(
    nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(),
    nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
).to(device)  # fmt: skip
if args.wrap == "ddp":
    model: nn.Module = nn.parallel.DistributedDataParallel(net)
elif args.wrap == "fsdp":
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    model = fully_shard(net)
else:
    model = net
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
step, began, measured = 0, 0.0, 0
for epoch in range(args.epochs):
    loader.sampler.set_epoch(epoch)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        if dist.get_rank() == 1 and step + 1 in PAUSES:
            wait_for_nothing(PAUSES[step + 1])
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == args.warmup:
            began = time.perf_counter()
        elif step > args.warmup:
            measured += len(images)
        if step % 20 == 0 and dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
# Every rank's images after the warm-up, over rank 0's time (a benchmark's figure).
total = torch.tensor([measured], device=device)
dist.all_reduce(total)
if dist.get_rank() == 0 and began:
    print(f"images/s {int(total) / (time.perf_counter() - began):.1f}", flush=True)
# DDP's reducer before the group it holds: left to the interpreter's end, Gloo's threads can
# abort the process ("terminate called without an active exception", 1 run in ~10 here under
# torchrun --tee, with or without Trainyard).
del model, optimizer
dist.destroy_process_group()
