"""Saving and loading training state (rank 0 writes; any strategy can resume any checkpoint).

Rank 0 writes ``epoch-N.pt`` at the end of each epoch and, on request, ``step-N.pt`` at the next
step boundary (``training.run_requests``). A mid-epoch checkpoint
records how many images of its epoch were trained, so a resumed run skips exactly those in the
epoch's seeded order and ends where an uninterrupted run would.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from training.config import TrainConfig

FORMAT = "trainyard-checkpoint"
VERSION = 1


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (a full disk, a file size limit, a read-only folder)."""


def save(
    directory: Path,
    *,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any] | None,
    epoch: int,
    step: int,
    config: dict[str, Any],
    images_into_epoch: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``epoch-{epoch}.pt``, or ``step-{step}.pt`` when ``images_into_epoch`` says the
    epoch is not over. ``model_state`` is the bare module's, never a DP/DDP wrapper's;
    ``optimizer_state`` None where there is none to save; ``extra``: a strategy's own entries
    (Hogwild's per-worker optimizer states)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": epoch,
        "step": step,
        # None: the epoch is complete. Else the images of `epoch` trained so far, in its order.
        "images_into_epoch": images_into_epoch,
        "model": model_state,
        "optimizer": optimizer_state,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        },
        "config": config,
        **(extra or {}),
    }
    name = f"epoch-{epoch}.pt" if images_into_epoch is None else f"step-{step}.pt"
    path = directory / name
    # A reader (or a resume after a crash) must never see a half-written file.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.")
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        Path(tmp).unlink(missing_ok=True)
        raise CheckpointWriteError(_write_failure(path, exc)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _write_failure(path: Path, exc: BaseException) -> str:
    # torch.save reports a full disk as "basic_ios::clear: iostream error" or "unexpected pos":
    # the free space is what tells the user what happened.
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free there"
    except OSError:
        free = "free space unknown"
    return f"could not write the checkpoint {path} ({free}): {exc}"


def load(path: Path) -> dict[str, Any]:
    # weights_only: a checkpoint is data; it must not be able to run code when loaded.
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a Trainyard checkpoint")
    if state.get("version") != VERSION:
        raise ValueError(f"{path} has checkpoint version {state.get('version')}, need {VERSION}")
    return state


def load_for(cfg: TrainConfig) -> dict[str, Any]:
    """``cfg.resume``, checked against ``cfg`` where a mismatch would silently change the run."""
    assert cfg.resume is not None
    state = load(Path(cfg.resume))
    saved: dict[str, Any] = state.get("config", {})
    if (
        state.get("optimizer") is not None
        and saved.get("optimizer", cfg.optimizer) != cfg.optimizer
    ):
        raise ValueError(
            f"the checkpoint was trained with --optimizer {saved['optimizer']}; "
            f"resume with the same optimizer (got --optimizer {cfg.optimizer})"
        )
    return state


def holds_torch_optimizer(state: dict[str, Any]) -> bool:
    """Whether the checkpoint's optimizer state is a torch optimizer's, not ZeRO's partitions
    (``training.strategies.deepspeed_zero``), which only DeepSpeed takes back."""
    saved = state.get("optimizer")
    return isinstance(saved, dict) and "state" in saved and "param_groups" in saved


_NUMBERED_FILE = re.compile(r"^(epoch|step)-(\d+)\.pt$")


def retention_apply(directory: Path, keep: int, kind: str = "epoch") -> list[Path]:
    """Delete all but the ``keep`` highest-numbered ``{kind}-N.pt`` in ``directory`` (0 keeps
    all; kind "epoch" for the epochs' files, "step" for those written on request); returns what
    was deleted. Other files are never touched."""
    if keep <= 0:
        return []
    numbered = sorted(
        (int(m.group(2)), p)
        for p in directory.iterdir()
        if (m := _NUMBERED_FILE.match(p.name)) and m.group(1) == kind and p.is_file()
    )
    deleted = []
    for _, path in numbered[:-keep]:
        path.unlink(missing_ok=True)
        deleted.append(path)
    return deleted


def restore_rng(state: dict[str, Any]) -> None:
    rng = state.get("rng", {})
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    cuda_states = rng.get("cuda") or []
    if cuda_states and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_states)
