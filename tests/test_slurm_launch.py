"""Which backend a launch takes, in process (the cluster's own answers: tests/test_slurm.py):
Slurm only where it is configured, its fields only for it, and the default backend."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.core.backends import (
    SLURM_NO_MACHINES,
    SLURM_OFF,
    SLURM_ONLY,
    SLURM_PARTITION_NAME,
    backend_default,
)
from dashboard.experiments.models import Backend, Experiment
from tests.factories import api_post

pytestmark = pytest.mark.django_db

DDP = {"strategy": "ddp", "processes": 1}


def test_slurm_is_refused_where_it_is_not_configured(api: Any, settings: Any) -> None:
    settings.TRAINYARD_SLURM = False
    refused = api_post(api, {**DDP, "backend": "slurm"})
    assert refused.status_code == 400
    assert refused.json()["errors"] == {"backend": [SLURM_OFF]}
    assert not Experiment.objects.exists()


def test_the_fields_only_slurm_reads_are_refused_on_the_workers(api: Any, launched: Any) -> None:
    refused = api_post(api, {**DDP, "partition": "gpu", "time_limit_minutes": 30})
    assert refused.status_code == 400
    assert refused.json()["errors"] == {
        "partition": [SLURM_ONLY],
        "time_limit_minutes": [SLURM_ONLY],
    }
    taken = api_post(api, DDP)
    assert taken.status_code == 201 and taken.json()["backend"] == "celery"
    assert taken.json()["scheduler"] is None  # a run on the workers has no job


def test_a_slurm_run_is_not_pinned_to_machines(api: Any, settings: Any) -> None:
    settings.TRAINYARD_SLURM = True
    refused = api_post(api, {**DDP, "backend": "slurm", "machines": ["host-a"]})
    assert refused.status_code == 400
    assert refused.json()["errors"] == {"machines": [SLURM_NO_MACHINES]}


def test_the_default_backend_is_slurm_only_where_no_worker_ever_reported(settings: Any) -> None:
    settings.TRAINYARD_SLURM = False
    assert backend_default() == Backend.CELERY
    settings.TRAINYARD_SLURM = True
    assert backend_default() == Backend.SLURM
    WorkerMachine.objects.create(hostname="host-a", report={}, reported_at=timezone.now())
    assert backend_default() == Backend.CELERY


def test_a_blank_backend_is_the_default_and_another_word_is_refused(api: Any) -> None:
    """As the form's blank choice: the API's "" is the default backend (tests/test_fuzz.py
    leaves it out of the values it plants as invalid); a backend outside the choices is a
    400 on its field."""
    launched = api_post(api, {**DDP, "backend": ""})
    assert launched.status_code == 201, launched.content
    assert launched.json()["backend"] == Backend.CELERY
    refused = api_post(api, {**DDP, "backend": "kubernetes"})
    assert refused.status_code == 400 and "backend" in refused.json()["errors"]
    assert Experiment.objects.count() == 1


@pytest.mark.parametrize("partition", ["debug,gpu", "--qos=high", "gpu a100", "gpu;true", "$(id)"])
def test_a_partition_is_one_name(api: Any, settings: Any, partition: str) -> None:
    """A list would let sbatch choose among partitions the launch checks never judged (a
    study's runs are not asked against sinfo); an option or a shell word is no name."""
    settings.TRAINYARD_SLURM = True
    refused = api_post(api, {**DDP, "backend": "slurm", "partition": partition})
    assert refused.status_code == 400
    assert refused.json()["errors"] == {"partition": [SLURM_PARTITION_NAME]}
    assert not Experiment.objects.exists()
