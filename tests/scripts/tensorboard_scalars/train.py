"""A script that logs through TensorBoard's SummaryWriter and nothing else: its scalars become
the run's series with no Trainyard line."""

import torch
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("runs")
weight = torch.zeros(1, requires_grad=True)
optimizer = torch.optim.SGD([weight], lr=0.1)
for step in range(1, 6):
    loss = (weight - 2).pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    writer.add_scalar("train/loss", loss.item(), step)
    writer.add_scalars("weights", {"w": weight.item()}, step)
writer.close()
print("logged 5 steps", flush=True)
