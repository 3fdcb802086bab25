"""Slurm as an execution backend: an adapter over the scheduler's own commands (jobs.py over
commands.py), what they print read back (parse.py), the launch's checks against the partitions
(launch.py) and the sentences (texts.py). The runs' side (submit, the job's supervisor, the
reconciler) is runs/slurm/."""
