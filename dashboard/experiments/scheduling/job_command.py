"""What a cluster scheduler's job of a run is: its name, `ty-<run id>`, and its command, the
run's supervisor `manage.py slurm_job <id>` (runs/slurm/job.py), the same code a Celery worker
runs. Their one home: a Slurm batch job (slurm/jobs.py) and a Kubernetes TrainJob
(kubernetes/manifest.py) take both, each with its own interpreter and checkout path."""

from __future__ import annotations

JOB_PREFIX = "ty-"
# The management command (dashboard/management/commands/slurm_job.py).
JOB_COMMAND = "slurm_job"


def job_name(experiment_id: int) -> str:
    return f"{JOB_PREFIX}{experiment_id}"


def job_command(*, experiment_id: int, python: str, manage: str) -> list[str]:
    """The supervisor's argv: `python manage <JOB_COMMAND> <id>`."""
    return [python, manage, JOB_COMMAND, str(experiment_id)]
