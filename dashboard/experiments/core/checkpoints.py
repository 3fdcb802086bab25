"""Checkpoint files: where a reported checkpoint is on this machine, if it is here at all.

The training writes its checkpoints under `<TRAINYARD_RUNS_DIR>/<id>/checkpoints/` on the worker
that ran it, and the sink stores that path. The web server serves a file only when the path resolves
(symlinks followed) inside this run's folder under its own TRAINYARD_RUNS_DIR: a shared folder in
a multi-machine setup, the same folder on one machine. Anything else, a path that climbs out with
`..` or a link pointing elsewhere included, is treated as not here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import FileResponse

from dashboard.experiments.models import Checkpoint, Experiment


def run_dir(*, experiment_id: int) -> Path:
    return Path(settings.TRAINYARD_RUNS_DIR).resolve() / str(experiment_id)


def checkpoint_file_resolve(*, checkpoint: Checkpoint, folder_ok: bool = False) -> Path | None:
    """The checkpoint's file on this machine, or None when it cannot be served from here.
    `folder_ok`: a folder will do (to resume from: a Hugging Face checkpoint-N is one; a
    download is a file)."""
    allowed = run_dir(experiment_id=checkpoint.experiment_id)
    try:
        path = Path(checkpoint.path).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a NUL byte
        return None
    if not path.is_relative_to(allowed) or not (path.is_file() or folder_ok and path.is_dir()):
        return None
    return path


def checkpoint_where_text(*, checkpoint: Checkpoint, experiment: Experiment) -> str:
    """Why a checkpoint cannot be downloaded from this web server, in a sentence."""
    worker = checkpoint.worker or experiment.worker or "the worker"
    return (
        f"The file of step {checkpoint.step} (epoch {checkpoint.epoch}) is on {worker} "
        f"({checkpoint.path}), not on this web server: share TRAINYARD_RUNS_DIR between the "
        "workers and the web server to download it here, or copy it from that machine."
    )


def checkpoint_as_dict(*, checkpoint: Checkpoint, experiment: Experiment) -> dict[str, Any]:
    here = checkpoint_file_resolve(checkpoint=checkpoint) is not None
    where = "" if here else checkpoint_where_text(checkpoint=checkpoint, experiment=experiment)
    return {**checkpoint.as_dict(), "here": here, "where": where}


def checkpoint_file_response(*, checkpoint: Checkpoint, path: Path) -> FileResponse:
    # A torch file is opaque bytes; guessing from ".pt" gives a SNES page table's MIME type.
    return FileResponse(
        path.open("rb"),
        as_attachment=True,
        filename=f"trainyard-{checkpoint.experiment_id}-{path.name}",
        content_type="application/octet-stream",
    )
