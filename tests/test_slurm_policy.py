"""Policy stays Trainyard's on Slurm (issue 37, item 1): a run's priority goes to the cluster as
its job's --nice, the site's QoS with every job, and the per-user bound on runs in flight holds
for Slurm launches as for the workers'. In process, the cluster's commands as stand-ins
(tests/slurm_fake.py); the real cluster's nice: tests/test_slurm.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.scheduling.queue import PRIORITY_RANGE
from dashboard.experiments.scheduling.slurm.jobs import JobRequest, priority_nice, sbatch_args
from tests.factories import api_post
from tests.slurm_fake import SlurmFake, slurm_backend_fake

pytestmark = pytest.mark.django_db

SINFO = "debug|up|1:00:00|2|1|(null)|debug*\n"
LAUNCH = {"strategy": "ddp", "processes": 1, "backend": "slurm"}


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> SlurmFake:
    fake = slurm_backend_fake(tmp_path, monkeypatch, settings)
    fake.command("sinfo", out=SINFO)
    fake.command("sbatch", out="4242\n")
    fake.command("scontrol")
    return fake


def test_higher_priority_is_a_lower_nice_never_below_zero() -> None:
    low, high = PRIORITY_RANGE
    assert priority_nice(high) == 0  # as a bare sbatch: no user may ask for less
    assert priority_nice(0) == high
    assert priority_nice(low) == high - low
    assert priority_nice(high + 50) == 0 and priority_nice(low - 50) == high - low
    niceness = [priority_nice(p) for p in range(low, high + 1)]
    assert niceness == sorted(niceness, reverse=True) and min(niceness) == 0


def test_the_job_asks_for_the_priority_and_the_sites_qos(settings: Any) -> None:
    settings.TRAINYARD_SLURM_QOS = "ml"
    settings.TRAINYARD_SLURM_SBATCH_ARGS = "--qos=urgent"
    request = JobRequest(
        experiment_id=3, nodes=1, ranks_per_node=1, gpus_per_node=0, partition="",
        time_limit_minutes=None, log=Path("x.out"), priority=250,
    )  # fmt: skip
    args = sbatch_args(request)
    assert f"--nice={PRIORITY_RANGE[1] - 250}" in args and "--qos=ml" in args
    # The site's own options come last: sbatch takes an option's last value, so they win.
    assert args[-1] == "--qos=urgent" and args.index("--qos=ml") < len(args) - 1
    settings.TRAINYARD_SLURM_QOS = ""
    assert not [a for a in sbatch_args(request)[:-1] if a.startswith("--qos")]


def test_a_slurm_launch_is_bounded_per_user_and_submits_with_its_nice(
    api: Any, fake: SlurmFake, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """TRAINYARD_MAX_QUEUED_RUNS_PER_USER counts a user's Slurm runs and holds their launches:
    the cluster's queue never gets past it what Trainyard's own would refuse."""
    settings.TRAINYARD_MAX_QUEUED_RUNS_PER_USER = 1
    settings.TRAINYARD_SLURM_QOS = "ml"
    with django_capture_on_commit_callbacks(execute=True):
        first = api_post(api, LAUNCH)
    assert first.status_code == 201, first.content
    assert Experiment.objects.get().scheduler_job_id == "4242"
    (sbatch,) = fake.calls("sbatch")
    assert f"--nice={PRIORITY_RANGE[1]}" in sbatch.split() and "--qos=ml" in sbatch.split()
    with django_capture_on_commit_callbacks(execute=True):
        refused = api_post(api, LAUNCH)
    assert refused.status_code == 429 and refused.json()["limit"] == "queued_runs"
    assert "TRAINYARD_MAX_QUEUED_RUNS_PER_USER" in refused.json()["error"]
    assert len(fake.calls("sbatch")) == 1 and Experiment.objects.count() == 1
    # Its run ended: room again.
    Experiment.objects.update(status=Status.SUCCEEDED)
    with django_capture_on_commit_callbacks(execute=True):
        assert api_post(api, LAUNCH).status_code == 201
    assert len(fake.calls("sbatch")) == 2


def test_a_priority_changed_in_the_queue_renices_the_pending_job(
    user_factory: Any, experiment_factory: Any, fake: SlurmFake,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    from django.test import Client

    staff = Client()
    staff.force_login(user_factory(staff=True))
    run = experiment_factory(owner=user_factory(), strategy="ddp", processes=1,
                             backend=Backend.SLURM, scheduler_job_id="77")  # fmt: skip
    workers = experiment_factory(owner=user_factory(), strategy="ddp", processes=1)
    for pk, priority in ((run.pk, 900), (workers.pk, 5)):
        with django_capture_on_commit_callbacks(execute=True):
            answer = staff.post(f"/api/queue/{pk}/priority/", json.dumps({"priority": priority}),
                                content_type="application/json")  # fmt: skip
        assert answer.status_code == 200, answer.content
    # The Slurm run's job only; a run on the workers has none.
    assert fake.calls("scontrol") == [f"scontrol update JobId=77 Nice={PRIORITY_RANGE[1] - 900}"]
