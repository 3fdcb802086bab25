"""A Hugging Face Trainer script with no Trainyard line: a tiny ViT built from a config (no
download) on Fashion-MNIST's first images, on the CPU. --sleep slows each step (a test stops it
midway); --max-steps bounds the run."""

import argparse
import time

import torch
from fashion import fashion
from transformers import (
    Trainer,
    TrainerCallback,
    TrainingArguments,
    ViTConfig,
    ViTForImageClassification,
)

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=6)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--output", default="out")
args = parser.parse_args()


class Images(torch.utils.data.Dataset):
    def __init__(self, count: int):
        self.x, self.y = fashion(count)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(ARGS.sleep)


ARGS = args
config = ViTConfig(
    image_size=28,
    patch_size=7,
    num_channels=1,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    num_labels=10,
)
model = ViTForImageClassification(config)
training = TrainingArguments(
    output_dir=args.output,
    max_steps=args.max_steps,
    per_device_train_batch_size=16,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    dataloader_num_workers=0,
    learning_rate=1e-3,
)
trainer = Trainer(model=model, args=training, train_dataset=Images(1024), callbacks=[Slow()])
trainer.train()
print(f"trained to step {trainer.state.global_step}", flush=True)
