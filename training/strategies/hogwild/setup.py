"""What Hogwild's parent makes ready before its processes start: the data in shared memory,
where a resumed run continues, each process's optimizer state; and, once they have started,
which tensors every one of them sees shared."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from training import checkpoint
from training.checkpoint import Resumed, ResumePoint
from training.config import TrainConfig
from training.data.datasets import Dataset
from training.data.shared_data import (
    Segment,
    dataset_segment_create,
    resident_private,
    segment_remove,
    shared_flags,
    shared_tensors_report,
    stale_segments_remove,
    tensor_entry,
)
from training.data.sources import data_plan, mode_choose, streaming_dataset
from training.protocol import SharedTensor
from training.strategies.hogwild.messages import Ready

log = logging.getLogger(__name__)

# A checkpoint's per-process optimizer states: the key keeps its first name, so that older
# checkpoints resume.
PROCESS_OPTIMIZERS = "worker_optimizers"


def dataset_owned(cfg: TrainConfig, path: Path) -> tuple[Dataset, Segment | None]:
    """The run's data: where it stays resident, as one shared copy at ``path`` where it can be
    made; where it streams, the parent's reader (each process opens its own, no segment)."""
    plan = data_plan(cfg.dataset, Path(cfg.data_dir), cfg.data_path)
    mode, note = mode_choose(plan)
    if mode == "streaming":
        # The parent may start workers (it is no daemon); its processes cannot, and say so.
        data = streaming_dataset(plan, note, cfg.workers)
        if cfg.workers:
            note = (
                f"Hogwild's {cfg.nproc} processes read batches without DataLoader workers: "
                "they are daemonic processes, which cannot have children."
            )
            data = replace(data, notes=(*data.notes, note))
        return data, None
    stale_segments_remove()
    try:
        return dataset_segment_create(plan, note, path, cfg.workers)
    except OSError as exc:
        segment_remove(path)
        log.warning("no shared copy of the dataset (%s); each process loads its own", exc)
        return resident_private(plan, note, cfg.workers), None


def resume_plan(
    cfg: TrainConfig, state: dict[str, Any] | None, per_epoch: int
) -> tuple[Resumed, list[dict[str, Any] | None]]:
    """Where training continues, with its notes, and the optimizer state of each process."""
    if state is None:
        return Resumed(ResumePoint(), ()), [None] * cfg.nproc
    # The processes build their optimizers; each loads the checkpoint's state.
    resumed = checkpoint.resume_apply(
        cfg, state, optimizer=None, global_batch=cfg.batch_size * cfg.nproc, per_epoch=per_epoch
    )
    optimizer_states, notes = processes_optimizer_states(state, cfg.nproc)
    return Resumed(resumed.point, (*resumed.notes, *notes)), optimizer_states


def processes_optimizer_states(
    state: dict[str, Any], nproc: int
) -> tuple[list[dict[str, Any] | None], list[str]]:
    """The optimizer state each process starts from: its own where the checkpoint has one per
    process for as many processes, else process 0's (or a single process's) for all; and a
    note that says which."""
    if not checkpoint.holds_torch_optimizer(state):
        return [None] * nproc, []
    own = state.get(PROCESS_OPTIMIZERS)
    if isinstance(own, list) and len(own) == nproc and all(isinstance(o, dict) for o in own):
        # The note's words are older than the rename, and readers match them.
        note = f"Each of the {nproc} workers resumed its own optimizer state."
        return list(own), [note] if nproc > 1 else []
    note = (
        "The checkpoint holds one optimizer state (a requested checkpoint keeps process 0's, "
        "another strategy's its only one, or another number of processes); every process "
        "starts from it."
    )
    return [state["optimizer"]] * nproc, [note] if nproc > 1 else []


def shared_tensors(model: nn.Module, data: Dataset, ready: list[Ready]) -> list[SharedTensor]:
    """``started.shared_tensors``: shared where the parent and every process see it shared."""
    data_flags = [
        all(flags)
        for flags in zip(shared_flags(data), *(m.data_shared for m in ready), strict=True)
    ]
    shared = shared_tensors_report(data, data_flags)
    for i, (name, param) in enumerate(model.named_parameters()):
        everywhere = param.is_shared() and all(m.params_shared[i] for m in ready)
        shared.append(tensor_entry(f"model.{name}", param, everywhere))
    return shared
