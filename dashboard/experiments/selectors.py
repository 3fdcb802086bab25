"""What is read of experiments for a page or a client: the run's row as the API gives it, the
facts of where it lives, the WebSocket's first message. Nothing here writes (services.py does).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.utils import timezone

from dashboard.experiments.core.access import experiments_visible_to, reason_for_owner
from dashboard.experiments.core.backends import backend_default, slurm_configured
from dashboard.experiments.core.checkpoints import checkpoint_as_dict
from dashboard.experiments.core.descriptions import (
    experiment_devices_label,
    experiment_duration_seconds,
    experiment_language_settings,
    experiment_option_values,
    experiment_strategy_label,
)
from dashboard.experiments.core.forms import FIELDS
from dashboard.experiments.core.memory import experiment_memory_rows
from dashboard.experiments.core.messages import SnapshotMessage
from dashboard.experiments.core.reported import reported_silence_text
from dashboard.experiments.core.run_facts import snapshot_texts
from dashboard.experiments.core.stalls import StalledTexts, resume_offer, stalled_texts
from dashboard.experiments.metrics.breakdown import experiment_breakdown, experiment_straggler
from dashboard.experiments.metrics.language import (
    experiment_language,
    language_model,
    runs_language_read,
)
from dashboard.experiments.metrics.series import series_snapshot
from dashboard.experiments.metrics.throughput import (
    Throughput,
    rank_stats_so_far,
    run_figure,
    run_throughput_read,
)
from dashboard.experiments.models import Backend, Experiment
from dashboard.experiments.runs.slurm.publish import job_fact, job_fact_text
from dashboard.experiments.scheduling.slurm.commands import SlurmError
from dashboard.experiments.scheduling.slurm.jobs import (
    job_run_id,
    slurm_cluster_nodes,
    slurm_jobs_cached,
    slurm_partitions,
)


def experiment_run_facts(experiment: Experiment) -> dict[str, Any]:
    """What the `started` event said about where the run lives: shared tensors, stages."""
    info = experiment.run_info or {}
    tensors = info.get("shared_tensors")
    stages = info.get("stages")
    return {
        "shared_tensors": [t for t in tensors if isinstance(t, dict)]
        if isinstance(tensors, list)
        else [],
        "stages": [s for s in stages if isinstance(s, dict)] if isinstance(stages, list) else [],
        "zero_stage": info.get("zero_stage"),
        "world_size": info.get("world_size"),
        "global_batch_size": info.get("global_batch_size"),
        "machines": info.get("machines"),  # each rank's machine (protocol 1.5)
    }


def experiment_snapshot_build(*, experiment: Experiment, log_lines: int) -> SnapshotMessage:
    """What a page needs to draw a run from scratch: the WebSocket's first message. Its size
    is bounded whatever the run's length: series come bucketed, logs as the last lines."""
    logs = [line.as_dict() for line in experiment.logs.order_by("-seq", "-id")[:log_lines]]
    logs.reverse()
    run, rank_stats = experiment_run_facts(experiment), experiment.rank_stats or {}
    throughput = run_throughput_read(experiment_id=experiment.pk)
    checkpoints = [
        checkpoint_as_dict(checkpoint=c, experiment=experiment)
        for c in experiment.checkpoints.all()
    ]
    return {
        "type": "snapshot",
        "seq": experiment.last_seq,
        "experiment": experiment_as_dict(experiment, summed=throughput),
        "series": dict(series_snapshot(experiment=experiment)),
        "logs": logs,
        "run": run,
        "rank_stats": rank_stats,
        "checkpoints": checkpoints,
        "throughput": run_figure(throughput),
        # A language model's tokens/s, MFU and bits per byte with their texts, as each step and
        # epoch message brings them (metrics/language.py); None for the other models.
        "language": experiment_language(experiment, throughput)
        if language_model(experiment)
        else None,
        "texts": snapshot_texts(
            run=run,
            rank_stats=rank_stats_so_far(rank_stats, ranks=throughput.ranks()),
            checkpoints=checkpoints,
            memory=experiment_memory_rows(experiment),
        )
        # The straggler box's sentence (runs/stragglers.py), empty while no rank is named; the
        # stalled banner's lines beside the experiment's stalled (core/stalls.py).
        | {"straggler": experiment.straggler_text, "stalled": _stalled_texts(experiment)}
        # A Slurm run's job line ("" off Slurm), as each scheduler message brings it.
        | {"scheduler": job_fact_text(experiment)},
    }


def _stalled_texts(experiment: Experiment) -> StalledTexts:
    """The banner's texts; the Stop and resume's only while stalled (it asks the checkpoints)."""
    if not experiment.stalled:
        return stalled_texts(None)
    return stalled_texts(experiment.stalled, resume=resume_offer(experiment=experiment))


def iso_or_none(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def experiment_language_figures(
    experiment: Experiment,
    *,
    summed: Throughput | None = None,
    read: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The read JSON's language-model figures (metrics/language.py), null for the other models:
    tokens/s and MFU so far, the last evaluation's bits per byte, where the peak comes from,
    and the latest texts the model wrote ([{epoch, step, text}], oldest first). ``read``: the
    figures a list read for all its runs at once (``runs_language_read``)."""
    keys = ("tokens_per_second", "mfu", "bits_per_byte", "peak_source")
    if not language_model(experiment):
        return {**dict.fromkeys(keys), "samples": []}
    if read is None:
        summed = summed or run_throughput_read(experiment_id=experiment.pk)
        read = experiment_language(experiment, summed)
    return {**{key: read.get(key) for key in keys}, "samples": experiment.samples or []}


def experiment_as_dict(
    experiment: Experiment,
    *,
    breakdown: bool = True,
    summed: Throughput | None = None,
    language: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's read JSON; ``breakdown`` False leaves its queries over the series out (a
    list of runs: ``breakdown`` empty and ``straggler`` null there; a language model's
    figures from ``language``, which the list reads for all its runs at once, else from its
    tokens series alone); ``summed``: its stored throughput where the caller read it already."""
    if language is None and not breakdown and language_model(experiment):
        language = runs_language_read(experiments=[experiment]).get(experiment.pk)
    data: dict[str, Any] = {"id": experiment.pk}
    data.update({name: getattr(experiment, name) for name in FIELDS})
    data["data_path"] = experiment.data_path or None  # the API's null: no image or text folder
    # A language model's size and window as it trains with them; null for the other models.
    data.update(experiment_language_settings(experiment=experiment))
    # The strategy options: what the run trains with where its strategy reads one (a row from
    # before an option was declared gets its default), null where it does not.
    data.update(experiment_option_values(experiment=experiment))
    data.update(
        owner=experiment.owner.get_username(),
        status=experiment.status,
        created_at=iso_or_none(experiment.created_at),
        started_at=iso_or_none(experiment.started_at),
        finished_at=iso_or_none(experiment.finished_at),
        worker=experiment.worker,
        error=experiment.error,
        test_loss=experiment.test_loss,
        test_accuracy=experiment.test_accuracy,
        **experiment_language_figures(experiment, summed=summed, read=language),
        epoch=experiment.epoch,
        step=experiment.step,
        total_steps=experiment.total_steps,
        last_seq=experiment.last_seq,
        notes=experiment.notes,
        dataset_source=experiment.run_info.get("dataset_source"),
        waiting_reason=reason_for_owner(experiment=experiment, reason=experiment.waiting_reason),
        attempt=experiment.attempt,
        attempts=experiment.attempts,
        heartbeat_at=iso_or_none(experiment.heartbeat_at),
        stop_requested=experiment.cancel_requested_at is not None,
        checkpoint_requested=experiment.checkpoint_requested_at is not None,
        cancelled_by=experiment.cancelled_by.get_username() if experiment.cancelled_by else None,
        duration=experiment_duration_seconds(experiment=experiment),
        url=experiment.get_absolute_url(),
        devices_label=experiment_devices_label(experiment=experiment),
        tags=experiment.tags,
        note=experiment.note,
        # Brought in by POST /api/experiments/import/: no worker trained it here.
        imported=experiment.imported,
        # Reported from outside (a script elsewhere posts its events: runs/reported.py): its last
        # post, and the run page's sentence once it has been silent too long ("" else).
        reported=experiment.reported,
        last_heard_at=iso_or_none(experiment.last_heard_at),
        silence_text=reported_silence_text(experiment=experiment, now=timezone.now()),
        # The machines of the current (or last) attempt, node 0 first, with the ranks each ran.
        placement=experiment.placement,
        # Each rank's bytes at the last epoch (parameters, gradients, optimizer state, peak).
        memory=experiment.memory,
        # "DistributedDataParallel (PowerSGD)": the strategy with its options off default.
        strategy_label=experiment_strategy_label(experiment=experiment),
        # A script run's (strategy "script"): what ran, its code as the upload's id and hash or
        # the workers' folder; null (args: empty) for the other strategies.
        entrypoint=experiment.entrypoint or None,
        args=experiment.args,
        code=experiment.code_id,
        code_path=experiment.code_path or None,
        code_sha256=experiment.code.sha256 if experiment.code is not None else None,
        # Each rank's shares of its wall time over the run so far, by phase (protocol 1.9).
        breakdown=experiment_breakdown(experiment=experiment) if breakdown else [],
        # The rank markedly slower than the others over the latest windows, or null; the rank
        # the run names now (its row) as the sink judged it, kept down to the lower bar.
        straggler=(
            experiment_straggler(experiment=experiment, named=experiment.straggler_rank)
            if breakdown
            else None
        ),
        # Null, or where the ranks of a running run that makes no step are (protocol 1.13, as
        # its launcher said): since, each rank's collective, whether it waits in it, its stack
        # (in the list of runs, with ``breakdown`` off, no stacks: a few KB a rank, read per run).
        stalled=experiment.stalled if breakdown else _without_stacks(experiment.stalled),
        # A Slurm run's job as the reconciler last read it (runs/slurm/reconcile.py): its id,
        # state and Slurm's reason while it pends; null for a run on the workers.
        scheduler=job_fact(experiment),
    )
    return data


def slurm_launch_facts() -> dict[str, Any] | None:
    """What the launch form offers of Slurm: its partitions (sinfo; none, with why, where the
    cluster cannot be asked) and the default backend; None where Slurm is not configured."""
    if not slurm_configured():
        return None
    try:
        partitions, error = slurm_partitions(), ""
    except SlurmError as exc:
        partitions, error = [], str(exc)
    return {"partitions": partitions, "error": error, "default_backend": backend_default()}


def slurm_cluster_facts(*, user: Any) -> dict[str, Any] | None:
    """The device page's view of the Slurm cluster: its partitions, its nodes (CPUs, GPUs from
    their gres, state) and Trainyard's jobs in it, each with its run where `user` may see it;
    None where Slurm is not configured, and why where the cluster cannot be asked."""
    if not slurm_configured():
        return None
    try:
        partitions, nodes, jobs = slurm_partitions(), slurm_cluster_nodes(), slurm_jobs_cached()
    except SlurmError as exc:
        return {"error": str(exc), "partitions": [], "nodes": [], "jobs": []}
    ids = {job.job_id: job_run_id(job.name) for job in jobs.values()}
    visible = experiments_visible_to(user).filter(pk__in=ids.values(), backend=Backend.SLURM)
    runs = visible.in_bulk()
    rows = []
    for job in jobs.values():
        run = runs.get(ids[job.job_id] or 0)
        mine = run is not None and run.scheduler_job_id == job.job_id
        rows.append({"job": job, "run": run if mine else None})
    return {"error": "", "partitions": partitions, "nodes": nodes, "jobs": rows}


def _without_stacks(stalled: dict[str, Any] | None) -> dict[str, Any] | None:
    if not stalled:
        return stalled
    return {**stalled, "ranks": [{**rank, "stack": ""} for rank in stalled.get("ranks", [])]}
