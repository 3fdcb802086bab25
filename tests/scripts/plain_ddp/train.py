"""A user's plain DDP script (Gloo, its own model and task), as a test launches it: under
Trainyard it reports through `trainyard`, under plain torchrun the same lines do nothing.

The task is synthetic and says so: learn y = 3x - 1 from points each rank draws with its own
seed. --sleep slows each step so that a test can stop it midway.
"""

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import trainyard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
run = trainyard.init()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
first = 1
if run.resume_path:
    state = torch.load(run.resume_path, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    first = state["step"] + 1
    print(f"resumed from {run.resume_path} at step {state['step']}", flush=True)


def save(step: int) -> None:
    path = (run.checkpoint_dir or Path(".")) / f"step-{step}.pt"
    if rank == 0:
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "step": step}, path)
    dist.barrier()  # every rank leaves once the file is whole
    run.checkpoint_saved(path, step=step)


for step in range(first, args.steps + 1):
    generator = torch.Generator().manual_seed(step * world + rank)
    x = torch.rand(32, 1, generator=generator)
    loss = F.mse_loss(model(x), 3 * x - 1)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    run.log({"loss": loss.item(), "weight": model.module.weight.item()}, step=step)
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    if run.checkpoint_requested():
        save(step)
    if run.should_stop():
        save(step)
        print(f"stopping at step {step}", flush=True)
        break
    time.sleep(args.sleep)

run.finish()
dist.destroy_process_group()
