"""A run as a Slurm job: submitted (submit.py), supervised inside its job by the same code a
Celery worker runs (job.py, step.py), and mirrored by polling (reconcile.py)."""
