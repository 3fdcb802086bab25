"""Saving and loading training state (rank 0 writes; any strategy can resume any checkpoint)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = "trainyard-checkpoint"
VERSION = 1


def save(
    directory: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    step: int,
    config: dict[str, Any],
) -> Path:
    """Write ``epoch-{epoch}.pt``; ``model`` is the bare module, never a DP/DDP wrapper."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": epoch,
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        },
        "config": config,
    }
    path = directory / f"epoch-{epoch}.pt"
    # A reader (or a resume after a crash) must never see a half-written file.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.")
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: Path) -> dict[str, Any]:
    # weights_only: a checkpoint is data; it must not be able to run code when loaded.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a Trainyard checkpoint")
    if state.get("version") != VERSION:
        raise ValueError(f"{path} has checkpoint version {state.get('version')}, need {VERSION}")
    return state


def restore_rng(state: dict[str, Any]) -> None:
    rng = state.get("rng", {})
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    cuda_states = rng.get("cuda") or []
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_states)
