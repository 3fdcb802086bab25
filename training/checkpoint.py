"""Saving and loading training state (rank 0 writes; any strategy can resume any checkpoint).

Rank 0 writes ``epoch-N.pt`` at the end of each epoch and, on request, ``step-N.pt`` at the next
step boundary (``training.process.run_requests``). A mid-epoch checkpoint
records how many images of its epoch were trained, so a resumed run skips exactly those in the
epoch's seeded order and ends where an uninterrupted run would.

Writing (``checkpoint_write``: save, retention, the ``checkpoint`` event) and resuming
(``resume_apply``: optimizer and RNG states, where training continues) sit side by side here,
used alike by the shared loop (``training.engine``) and by Hogwild's parent.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from training.config import TrainConfig
    from training.protocol import EventWriter

log = logging.getLogger(__name__)

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
    (Hogwild's per-process optimizer states)."""
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
    # Checkpoints from before --model hold the built-in's weights.
    saved_model = saved.get("model", "simple-cnn")
    if saved_model != cfg.model:
        raise ValueError(
            f"the checkpoint {cfg.resume} holds the weights of --model {saved_model}, not of "
            f"--model {cfg.model}; resume it with --model {saved_model}"
        )
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


def checkpoint_write(
    cfg: TrainConfig,
    events: EventWriter,
    *,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any] | None,
    epoch: int,
    step: int,
    extra: dict[str, Any] | None = None,
    answers_request: bool = False,
    images_into_epoch: int | None = None,
) -> Path:
    """Write a checkpoint, apply the retention of its kind, then report it: the epoch's own
    (``--keep-checkpoints``), or, with ``images_into_epoch``, one written mid-epoch because
    someone asked (``--keep-requested-checkpoints``)."""
    assert cfg.checkpoint_dir is not None
    directory = Path(cfg.checkpoint_dir)
    path = save(
        directory,
        model_state=model_state,
        optimizer_state=optimizer_state,
        epoch=epoch,
        step=step,
        config=cfg.to_dict(),
        images_into_epoch=images_into_epoch,
        extra=extra,
    )
    requested = images_into_epoch is not None
    kind, keep, flag = (
        ("step", cfg.keep_requested_checkpoints, "--keep-requested-checkpoints")
        if requested
        else ("epoch", cfg.keep_checkpoints, "--keep-checkpoints")
    )
    # Before the event: whoever reads it can then list exactly the files that are left.
    for old in retention_apply(directory, keep, kind=kind):
        log.info("deleted %s (%s %d)", old, flag, keep)
    events.emit(
        "checkpoint",
        epoch=epoch,
        step=step,
        path=str(path),
        requested=requested,
        answers_request=answers_request or requested,
    )
    return path


def checkpoint_request_refuse(events: EventWriter, *, step: int) -> None:
    events.log(
        f"A checkpoint was requested at step {step}, but this run writes none: start it with "
        "--checkpoint-dir.",
        "warning",
    )


@dataclass(frozen=True)
class ResumePoint:
    start_epoch: int = 1  # the first epoch to train
    step: int = 0  # global optimizer steps already taken
    skip_batches: int = 0  # batches of start_epoch already trained (a mid-epoch checkpoint)


@dataclass(frozen=True)
class Resumed:
    """What ``resume_apply`` found: where training continues, and what to tell the user."""

    point: ResumePoint
    notes: tuple[str, ...]


def resume_apply(
    cfg: TrainConfig,
    state: dict[str, Any],
    *,
    optimizer: torch.optim.Optimizer | None,
    takes_optimizer: bool = True,
    restore: Callable[[dict[str, Any]], str] | None = None,
    global_batch: int,
    per_epoch: int,
) -> Resumed:
    """Load the optimizer state and RNG states of a checkpoint whose model is already loaded;
    returns where training continues and the notes that say what was resumed.

    ``optimizer`` None with ``takes_optimizer``: the caller hands the state on itself (Hogwild's
    processes); ``restore``: the strategy takes it its own way (ZeRO, partitioned);
    ``takes_optimizer`` False: it cannot take a plain optimizer's state.
    """
    note = _optimizer_resume(
        cfg, state, optimizer, takes_optimizer=takes_optimizer, restore=restore
    )
    restore_rng(state)
    point, notes = _resume_point(cfg, state, global_batch=global_batch, per_epoch=per_epoch)
    return Resumed(point, (*([note] if note else []), *notes))


def _optimizer_resume(
    cfg: TrainConfig,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    *,
    takes_optimizer: bool,
    restore: Callable[[dict[str, Any]], str] | None,
) -> str | None:
    """Hand the checkpoint's optimizer state to whoever takes it; returns a note, if any."""
    saved_optimizer = state.get("optimizer")
    if saved_optimizer is None:
        return "The checkpoint holds no optimizer state; the optimizer starts afresh."
    if restore is not None:
        return restore(saved_optimizer)
    if not takes_optimizer or not holds_torch_optimizer(state):
        return (
            "This strategy does not take the checkpoint's optimizer state; the optimizer "
            "starts afresh."
        )
    if optimizer is not None:
        optimizer_state_load(optimizer, saved_optimizer, lr=cfg.lr)
    return None


def optimizer_state_load(
    optimizer: torch.optim.Optimizer, saved: dict[str, Any], *, lr: float
) -> None:
    """Load a saved torch optimizer state, keeping this run's learning rate."""
    optimizer.load_state_dict(saved)
    # The saved learning rate would silently override --lr.
    for group in optimizer.param_groups:
        group["lr"] = lr


def _resume_point(
    cfg: TrainConfig, state: dict[str, Any], *, global_batch: int, per_epoch: int
) -> tuple[ResumePoint, list[str]]:
    """Where training continues after ``state``, and the notes that say so."""
    notes = []
    epoch, step = int(state["epoch"]), int(state["step"])
    point = ResumePoint(epoch + 1, step)
    trained = state.get("images_into_epoch")
    if trained is not None:
        # The epoch's image order is seeded, so skipping the images trained is exact when the
        # global batch is the one the checkpoint was written with.
        skip, rest = divmod(int(trained), global_batch)
        if skip < per_epoch:
            point = ResumePoint(epoch, step, skip)
        if rest:
            notes.append(
                f"The checkpoint was written {trained} images into epoch {epoch}, not a whole "
                f"number of this run's global batches of {global_batch}: {rest} of them are "
                "trained again."
            )
    where = f"epoch {epoch}, step {step}" + (
        f" ({trained} images into the epoch)" if trained is not None else ""
    )
    notes.append(
        f"Resumed from {cfg.resume} at {where}; training continues with epoch "
        f"{point.start_epoch}"
        + (f" from its batch {point.skip_batches + 1}." if point.skip_batches else ".")
    )
    return point, notes
