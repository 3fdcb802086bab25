"""Which backend runs a run, as the launch form and the API take it: Trainyard's Celery workers
(the default: machines of one's own, placed here) or a Slurm cluster (TRAINYARD_SLURM: one batch
job per run, placed by the cluster's scheduler). Both may be configured at once; a run goes to one.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Backend

SLURM_OFF = "Slurm is not configured on this server (TRAINYARD_SLURM=1 turns it on)"
SLURM_NO_MACHINES = (
    "a Slurm run's nodes are its cluster's to choose: pick a partition (or name nodes with "
    "--nodelist in TRAINYARD_SLURM_SBATCH_ARGS)"
)
SLURM_ONLY = "only a Slurm run reads it (backend slurm)"
SLURM_FIELDS = ("partition", "time_limit_minutes")
# A partition's name as sites write them: one name, never a list ("a,b": sbatch would take
# either), an option or a space. It reaches sbatch as one argument; checked here all the same,
# before the cluster is asked (a study's runs are not asked: sbatch would refuse them).
PARTITION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SLURM_PARTITION_NAME = "one partition's name: letters, digits, '_', '-' and '.'"


def slurm_configured() -> bool:
    return bool(settings.TRAINYARD_SLURM)


def backend_default() -> str:
    """celery, unless only Slurm is configured: TRAINYARD_SLURM on and no worker has ever
    reported (an installation of workers keeps them as its default, even while they are off)."""
    if slurm_configured() and not WorkerMachine.objects.exists():
        return str(Backend.SLURM)
    return str(Backend.CELERY)


def backend_refusals(data: dict[str, Any]) -> dict[str, str]:
    """The launch's backend (left empty: backend_default, written into `data`) and the fields
    it reads or refuses, by field."""
    backend = data.get("backend") or backend_default()
    data["backend"] = backend
    if backend != Backend.SLURM:
        return {name: SLURM_ONLY for name in SLURM_FIELDS if data.get(name)}
    if not slurm_configured():
        return {"backend": SLURM_OFF}
    if data.get("machines"):
        return {"machines": SLURM_NO_MACHINES}
    if data.get("partition") and not PARTITION_NAME.fullmatch(str(data["partition"])):
        return {"partition": SLURM_PARTITION_NAME}
    return {}
