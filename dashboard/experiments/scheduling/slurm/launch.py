"""A Slurm run's launch checks: what no partition of the cluster could ever run is refused then
(400, on the field where the fix is), as the Celery backend refuses more machines or devices
than the workers have. What is only busy waits in the cluster's queue, with Slurm's reason."""

from __future__ import annotations

from django.conf import settings

from dashboard.experiments.scheduling.slurm.commands import SlurmError
from dashboard.experiments.scheduling.slurm.jobs import slurm_partitions
from dashboard.experiments.scheduling.slurm.parse import Partition
from training.refusals import plural

Errors = dict[str, list[str]]


def slurm_launch_refusals(
    *, partition: str, nodes: int, ranks_per_node: int, gpus_per_node: int,
    time_limit_minutes: int | None,
) -> Errors:  # fmt: skip
    """The refusals of a run's job, by field; empty where its partition can hold it."""
    try:
        partitions = slurm_partitions()
    except SlurmError as exc:
        return {"backend": [f"the Slurm cluster could not be asked for its partitions: {exc}"]}
    name = partition or settings.TRAINYARD_SLURM_PARTITION
    chosen = next((p for p in partitions if (p.name == name if name else p.default)), None)
    if chosen is None:
        have = ", ".join(p.name for p in partitions) or "none"
        said = f"no partition {name!r}" if name else "the cluster has no default partition"
        return {"partition": [f"{said}; its partitions: {have}"]}
    errors = partition_refusals(
        chosen, nodes=nodes, ranks_per_node=ranks_per_node, gpus_per_node=gpus_per_node,
        time_limit_minutes=time_limit_minutes,
    )  # fmt: skip
    if errors:
        fits = [p.name for p in partitions if p is not chosen and not partition_refusals(
            p, nodes=nodes, ranks_per_node=ranks_per_node, gpus_per_node=gpus_per_node,
            time_limit_minutes=time_limit_minutes,
        )]  # fmt: skip
        if fits:
            errors.setdefault("partition", []).append(f"partition {', '.join(fits)} can run it")
    return errors


def partition_refusals(
    part: Partition, *, nodes: int, ranks_per_node: int, gpus_per_node: int,
    time_limit_minutes: int | None,
) -> Errors:  # fmt: skip
    """Why `part` could never run the job (more nodes, cores, GPUs or time than it has)."""
    errors: Errors = {}
    if nodes > part.nodes:
        errors["nodes"] = [
            f"partition {part.name} has {plural(part.nodes, 'node')}; this run asks for {nodes}"
        ]
    if gpus_per_node > part.gpus_per_node:
        errors["gpus"] = [
            f"partition {part.name}'s nodes have {plural(part.gpus_per_node, 'GPU')} at most; "
            f"this run asks for {gpus_per_node} on each"
        ]
    elif not gpus_per_node and ranks_per_node > part.cpus_per_node:
        errors["processes"] = [
            f"partition {part.name}'s nodes have {plural(part.cpus_per_node, 'CPU')} at most; "
            f"this run starts {ranks_per_node} ranks on each (a core each)"
        ]
    limit = part.max_minutes
    if time_limit_minutes is not None and limit is not None and time_limit_minutes > limit:
        errors["time_limit_minutes"] = [
            f"partition {part.name} runs a job {limit} minutes at most; this run asks for "
            f"{time_limit_minutes}"
        ]
    return errors
