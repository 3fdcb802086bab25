"""`manage.py slurm_job <run id>`: a run's Slurm job, as its batch script starts it
(scheduling/slurm/jobs.py): the run's supervisor inside the allocation (runs/slurm/job.py,
through tasks.slurm_job_supervise, which wakes the workers' queue where the run starts)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dashboard.experiments.tasks import slurm_job_supervise


class Command(BaseCommand):
    help = "Supervise a run inside its Slurm job (the job's batch script runs this)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("experiment_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        status = slurm_job_supervise(experiment_id=options["experiment_id"])
        left = status or "left to the reconciler"
        self.stdout.write(f"run {options['experiment_id']}: {left}")
