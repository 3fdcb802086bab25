"""Profiles as the API and the page give them, their files, and their texts: the one home of
what a profile looks like outside the worker.

The training writes each rank's trace under `<TRAINYARD_RUNS_DIR>/<id>/profiles/<profile>/` on
the machine of that rank; as with checkpoints (core/checkpoints.py), this web server serves a
file only where its path resolves inside this run's folder under its own TRAINYARD_RUNS_DIR.
A profile's files go with its row (the post_delete receivers below): when the worker keeps only
the newest TRAINYARD_PROFILES_KEPT (runs/profiles.py), and with the run, whose whole profiles
folder goes (on the machine that deletes it: share TRAINYARD_RUNS_DIR, as for downloads).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.http import FileResponse
from django.urls import reverse

from dashboard.experiments.core.checkpoints import run_dir
from dashboard.experiments.models import Experiment, Profile, ProfileState
from dashboard.texts import bytes_text
from training.process.run_requests import PROFILE_MAX_STEPS
from training.registry import strategy_get

PROFILE_STEPS_DEFAULT = 20  # what the page's field offers
# A script run whose launcher named no profile folder: its observer is off, which records them
# (training/scripts/control.py's profiles_refusal says which on the worker, in the run's log).
SCRIPT_UNPROFILED = (
    "This script run cannot record a profile: its observer, which records them, is off "
    "(TRAINYARD_OBSERVE=0 on its worker)."
)
REPORTED_UNPROFILED = (
    "A run reported from outside cannot record a profile: no Trainyard launcher runs its "
    "script to pass the request on."
)


def profiles_dir(*, experiment_id: int) -> Path:
    """Where the training of run `experiment_id` writes its profiles (its --profile-dir)."""
    return Path(settings.TRAINYARD_RUNS_DIR) / str(experiment_id) / "profiles"


def profile_refusal(*, experiment: Experiment) -> str:
    """Why this run cannot record a profile ("" when it can): its strategy's (the registry's
    word), or, for a script, no launcher to ask or one that said it takes no profiles (its
    started event names no profile_dir)."""
    reason = strategy_get(experiment.strategy).profile_refusal
    if reason:
        return f"{experiment.get_strategy_display()} cannot record a profile: {reason}"
    if experiment.reported:
        return REPORTED_UNPROFILED
    started = experiment.run_info
    if strategy_get(experiment.strategy).user_script and started and not started.get("profile_dir"):
        return SCRIPT_UNPROFILED
    return ""


def profile_trace_resolve(*, profile: Profile, rank: int) -> Path | None:
    """The rank's trace file on this machine, or None when it cannot be served from here."""
    entry = next((t for t in profile.traces if t.get("rank") == rank), None)
    if entry is None or entry.get("dropped"):
        return None
    allowed = run_dir(experiment_id=profile.experiment_id)
    try:
        path = Path(str(entry.get("path"))).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # missing, a link loop, a NUL byte
        return None
    return path if path.is_relative_to(allowed) and path.is_file() else None


def profile_trace_response(*, profile: Profile, rank: int, path: Path) -> FileResponse:
    # Perfetto and chrome://tracing open the gzipped JSON as it is: no Content-Encoding, so
    # that the browser saves the .gz rather than unpacking it into a file named .gz.
    return FileResponse(
        path.open("rb"),
        as_attachment=True,
        filename=f"trainyard-{profile.experiment_id}-profile-{profile.pk}-rank-{rank}.json.gz",
        content_type="application/gzip",
    )


# The files go once the delete commits: a delete that rolls back keeps its rows' traces.
@receiver(post_delete, sender=Profile, dispatch_uid="profile_files_delete")
def _profile_deleted(sender: type[Profile], instance: Profile, **kwargs: Any) -> None:
    # Also for each row a deleted run takes with it (CASCADE sends it per row). The folder is
    # named now: delete() clears the instance's pk before the commit.
    folder = profiles_dir(experiment_id=instance.experiment_id) / str(instance.pk)
    transaction.on_commit(lambda: shutil.rmtree(folder, ignore_errors=True))


@receiver(post_delete, sender=Experiment, dispatch_uid="profiles_dir_delete")
def _run_deleted(sender: type[Experiment], instance: Experiment, **kwargs: Any) -> None:
    # What no row holds goes too: the last request.json, a profile the run ended during.
    folder = profiles_dir(experiment_id=instance.pk)
    transaction.on_commit(lambda: shutil.rmtree(folder, ignore_errors=True))


def profile_trace_rows(*, profile: Profile) -> list[dict[str, Any]]:
    """The profile's kept traces, `{rank, steps, bytes, url}` (the list route's shape)."""
    steps = profile.recorded_steps or profile.steps
    return [
        {
            "rank": t["rank"],
            "steps": steps,
            "bytes": t.get("bytes"),
            "profile": profile.pk,
            "first_step": profile.first_step,
            "bytes_text": bytes_text(t.get("bytes")),
            "url": reverse(
                "api-experiment-profile-trace",
                args=[profile.experiment_id, profile.pk, t["rank"]],
            ),
        }  # fmt: skip
        for t in profile.traces
        if not t.get("dropped")
    ]


def profile_state_text(*, profile: Profile) -> str:
    """Where the profile stands, in a sentence."""
    first, recorded = profile.first_step, profile.recorded_steps
    if profile.state == ProfileState.REQUESTED:
        return (
            f"Requested: {profile.steps} step(s); every rank starts recording at the "
            "training's next reported step."
        )
    if profile.state == ProfileState.RECORDING:
        return f"Recording {profile.steps} step(s) from step {first} on every rank…"
    if profile.state == ProfileState.FAILED:
        return f"Not recorded: {profile.message}"
    last = (first or 0) + (recorded or 0) - 1
    shorter = (
        " (the epoch ended first)" if recorded is not None and recorded < profile.steps else ""
    )
    return f"Ready: steps {first}–{last}{shorter}, one trace per rank."


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "—"


def rank_summary_view(entry: dict[str, Any]) -> dict[str, Any]:
    """A rank's summary (protocol 1.10's ProfileRankSummary) with its texts for the page."""
    wall = float(entry.get("wall_seconds") or 0.0)
    comm = float(entry.get("communication_seconds") or 0.0)
    overlap = float(entry.get("overlap_seconds") or 0.0)
    self_total = sum(float(op.get("self_cpu_seconds") or 0.0) for op in entry.get("ops", []))
    return {
        **entry,
        "computation_text": _percent(float(entry.get("computation_seconds") or 0.0), wall),
        "communication_text": _percent(comm, wall),
        "overlap_text": _percent(overlap, comm) + " of it hidden" if comm > 0 else "none",
        "wall_text": f"{wall:.3f} s",
        "ops": [
            {**op, "self_text": f"{1000 * float(op.get('self_cpu_seconds') or 0.0):.1f} ms",
             "share_text": _percent(float(op.get("self_cpu_seconds") or 0.0), self_total)}
            for op in entry.get("ops", [])
        ],
    }  # fmt: skip


def profile_as_dict(*, profile: Profile) -> dict[str, Any]:
    """The profile as the page and the API show it."""
    return {
        "id": profile.pk,
        "state": profile.state,
        "state_text": profile_state_text(profile=profile),
        "in_flight": profile.state in (ProfileState.REQUESTED, ProfileState.RECORDING),
        "steps": profile.steps,
        "first_step": profile.first_step,
        "recorded_steps": profile.recorded_steps,
        "requested_at": profile.requested_at.isoformat() if profile.requested_at else None,
        "traces": profile_trace_rows(profile=profile),
        "dropped": [t for t in profile.traces if t.get("dropped")],
        "summary": [rank_summary_view(s) for s in profile.summary if isinstance(s, dict)],
    }


def profile_panel(*, experiment: Experiment) -> dict[str, Any]:
    """What the run page's profile panel starts from; the page follows `profile` messages."""
    latest = experiment.profiles.order_by("-requested_at", "-pk").first()
    return {
        "latest": profile_as_dict(profile=latest) if latest is not None else None,
        "refusal": profile_refusal(experiment=experiment),
        "steps_default": PROFILE_STEPS_DEFAULT,
        "steps_max": PROFILE_MAX_STEPS,
        "request_url": reverse("api-experiment-profile", args=[experiment.pk]),
        "latest_url": reverse("api-experiment-profile-latest", args=[experiment.pk]),
    }
