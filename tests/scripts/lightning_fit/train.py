"""A Lightning script with no Trainyard line: a small network on Fashion-MNIST's first images,
DDP on the CPU (Gloo). --sleep slows each step (a test stops it midway)."""

import argparse
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from fashion import fashion

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=6)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.layers(x), y)
        self.log("train_loss", loss)
        time.sleep(args.sleep)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


x, y = fashion(1024)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
trainer = L.Trainer(
    max_steps=args.max_steps,
    accelerator="cpu",
    strategy="ddp",
    num_nodes=1,
    devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    log_every_n_steps=1,
    enable_progress_bar=False,
    enable_model_summary=False,
    enable_checkpointing=False,
    logger=False,
)
trainer.fit(Net(), data)
print(f"trained to step {trainer.global_step}", flush=True)
