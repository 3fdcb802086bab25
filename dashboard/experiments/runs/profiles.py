"""A profile on the worker: the request passed to the training, its events stored on the row,
its traces held to the byte cap and the run's profiles to the newest few.

The page and API asked through services.py (a `requested` Profile row, one in flight per run);
the supervisor (requests.py) writes `request.json` into the training's --profile-dir and sends
SIGUSR2; the training's `profile` events (protocol 1.10) move the row to `recording`, then
`ready` with every rank's trace, or `failed`. A trace file over TRAINYARD_PROFILE_MAX_BYTES is
deleted as it comes (its summary stays, the page says why there is no file), and once a
profile is ready only the newest TRAINYARD_PROFILES_KEPT of the run are kept: the older rows
are deleted, and their files with them (core/profiles.py's receiver).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from django.conf import settings

from dashboard.experiments.core.profiles import profiles_dir
from dashboard.experiments.models import PROFILE_IN_FLIGHT, Experiment, Profile, ProfileState
from dashboard.experiments.runs.bounds import is_count, number_or_none
from dashboard.experiments.runs.retention import MAX_PATH_CHARS, file_size
from dashboard.texts import bytes_text
from training.process.run_requests import PROFILE_REQUEST_FILE

MAX_RANKS = 4096  # bound what one event can put on the row
MAX_OPS = 20


def profile_request_write(*, profile_dir: str, profile_id: int, steps: int) -> str:
    """Write the request where the training reads it; returns why it could not, or ""."""
    try:
        folder = Path(profile_dir)
        folder.mkdir(parents=True, exist_ok=True)
        asked = {"profile": profile_id, "steps": steps}
        # Written whole, then renamed: the training never reads half a request.
        partial = folder / f".{PROFILE_REQUEST_FILE}.{os.getpid()}"
        partial.write_text(json.dumps(asked))
        partial.replace(folder / PROFILE_REQUEST_FILE)
    except (OSError, ValueError) as exc:
        return f"the request could not be written in {profile_dir}: {exc}"
    return ""


def profile_fail(*, experiment_id: int, profile_id: int | None, message: str) -> int:
    """Mark the run's profile in flight (`profile_id`'s, or any) failed; returns rows moved."""
    rows = Profile.objects.filter(experiment_id=experiment_id, state__in=PROFILE_IN_FLIGHT)
    if profile_id:
        rows = rows.filter(pk=profile_id)
    return rows.update(state=ProfileState.FAILED, message=message[:2000])


def trace_capped(entry: Any, *, max_bytes: int, folder: Path) -> dict[str, Any] | None:
    """A `traces` entry as stored: checked, sized by this worker where the file is here, and
    its file deleted when over the cap (`dropped` says so) if it lies in ``folder``, the
    profile's own (an event naming any other file never deletes it); None when it is not one."""
    if not isinstance(entry, dict) or not is_count(entry.get("rank")):
        return None
    path = entry.get("path")
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
        return None
    reported = entry.get("bytes")
    size = file_size(path)
    size = size if size is not None else (reported if is_count(reported) else None)
    dropped = ""
    if size is not None and size > max_bytes:
        dropped = (
            f"the trace was {bytes_text(size)}, over the cap of {bytes_text(max_bytes)} "
            "(TRAINYARD_PROFILE_MAX_BYTES): deleted, its summary kept; ask for fewer steps"
        )
        if _inside(path, folder):
            Path(path).unlink(missing_ok=True)
    return {"rank": entry["rank"], "path": path, "bytes": size, "dropped": dropped}


def _inside(path: str, folder: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte
        return False


SUMMARY_FIGURES = (
    "wall_seconds",
    "computation_seconds",
    "communication_seconds",
    "overlap_seconds",
)
OP_FIGURES = ("self_cpu_seconds", "cpu_seconds")


def summary_bounded(reported: Any) -> list[dict[str, Any]]:
    """The event's summary as stored: dicts only, its lists bounded."""
    if not isinstance(reported, list):
        return []
    entries = [e for e in reported[:MAX_RANKS] if isinstance(e, dict)]
    for entry in entries:
        ops = entry.get("ops")
        entry["ops"] = (
            [op for op in ops[:MAX_OPS] if isinstance(op, dict)] if isinstance(ops, list) else []
        )
        # The page does arithmetic on these: a figure that is not a number is stored as 0.
        for fields, where in ((SUMMARY_FIGURES, [entry]), (OP_FIGURES, entry["ops"])):
            for holder in where:
                for name in fields:
                    holder[name] = number_or_none(holder.get(name)) or 0.0
    return entries


def profile_event_store(*, experiment: Experiment, message: dict[str, Any]) -> Profile | None:
    """Move the profile the event is about; returns its row as it now stands."""
    reported, state = message.get("profile"), message.get("state")
    number = reported if is_count(reported) else None
    if state == "refused":
        text = str(message.get("message") or "the training refused it")
        profile_fail(experiment_id=experiment.pk, profile_id=number, message=text)
    elif state == "recording" and number is not None:
        first = message.get("first_step")
        Profile.objects.filter(
            pk=number, experiment_id=experiment.pk, state=ProfileState.REQUESTED
        ).update(state=ProfileState.RECORDING, first_step=first if is_count(first) else None)
    elif state == "ready" and number is not None:
        _profile_ready(experiment=experiment, number=number, message=message)
    rows = Profile.objects.filter(experiment_id=experiment.pk)
    return rows.filter(pk=number).first() if number else rows.order_by("-pk").first()


def _profile_ready(*, experiment: Experiment, number: int, message: dict[str, Any]) -> None:
    cap = settings.TRAINYARD_PROFILE_MAX_BYTES
    folder = profiles_dir(experiment_id=experiment.pk) / str(number)
    reported = message.get("traces")
    entries = reported[:MAX_RANKS] if isinstance(reported, list) else []
    traces = [trace_capped(t, max_bytes=cap, folder=folder) for t in entries]
    first, recorded = message.get("first_step"), message.get("recorded_steps")
    moved = Profile.objects.filter(
        pk=number, experiment_id=experiment.pk, state__in=PROFILE_IN_FLIGHT
    ).update(
        state=ProfileState.READY,
        traces=[t for t in traces if t is not None],
        summary=summary_bounded(message.get("summary")),
        first_step=first if is_count(first) else None,
        recorded_steps=recorded if is_count(recorded) else None,
        worker=experiment.worker or "",
    )
    if moved:
        profiles_prune(experiment_id=experiment.pk, keep=settings.TRAINYARD_PROFILES_KEPT)


def profiles_prune(*, experiment_id: int, keep: int) -> list[int]:
    """Delete all but the newest `keep` ready profiles of the run, and the failed ones older than
    the oldest kept (their files go with them); returns the ids deleted. Failed ones do not
    count towards `keep`: two stopped recordings must not push out the one trace there is."""
    rows = Profile.objects.filter(experiment_id=experiment_id).order_by("-requested_at", "-pk")
    ready = list(rows.filter(state=ProfileState.READY))
    old = ready[max(keep, 1) :]
    if old:
        oldest_kept = ready[max(keep, 1) - 1]
        old += list(
            rows.filter(state=ProfileState.FAILED, requested_at__lte=oldest_kept.requested_at)
        )
    ids = [p.pk for p in old]  # before delete() clears them
    for profile in old:
        profile.delete()  # one by one: each row's receiver deletes its files
    return ids
