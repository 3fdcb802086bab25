"""Policy stays Trainyard's on Slurm (issue 37, item 1): a run's priority goes to the cluster as
its job's --nice, the site's QoS with every job, and the per-user bound on runs in flight holds
for Slurm launches as for the workers'. Its GPUs (item 2) are asked per node and taken as Slurm
gives them. In process, the cluster's commands as stand-ins
(tests/slurm_fake.py); the real cluster's nice: tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dashboard.experiments.models import Backend, Experiment, Status
from dashboard.experiments.scheduling.queue import PRIORITY_RANGE
from dashboard.experiments.scheduling.slurm.jobs import (
    JobRequest,
    priority_nice,
    sbatch_args,
    srun_command,
)
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


def test_a_lowered_priority_is_a_higher_nice_and_the_default_none() -> None:
    low, high = PRIORITY_RANGE
    assert priority_nice(0) == 0 and priority_nice(high) == 0  # as a bare sbatch's job
    assert priority_nice(-300) == 300 and priority_nice(low) == -low
    assert priority_nice(high + 50) == 0 and priority_nice(low - 50) == -low
    niceness = [priority_nice(p) for p in range(low, high + 1)]
    assert niceness == sorted(niceness, reverse=True) and min(niceness) == 0


def test_the_job_asks_for_the_priority_and_the_sites_qos(settings: Any) -> None:
    settings.TRAINYARD_SLURM_QOS = "ml"
    settings.TRAINYARD_SLURM_SBATCH_ARGS = "--qos=urgent"
    request = JobRequest(
        experiment_id=3, nodes=1, ranks_per_node=1, gpus_per_node=0, partition="",
        time_limit_minutes=None, log=Path("x.out"), priority=-250,
    )  # fmt: skip
    args = sbatch_args(request)
    assert "--nice=250" in args and "--qos=ml" in args
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
    assert "--nice=0" in sbatch.split() and "--qos=ml" in sbatch.split()
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
    user_factory: Any, experiment_factory: Any, fake: SlurmFake, settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    from django.test import Client

    staff = Client()
    staff.force_login(user_factory(staff=True))
    run = experiment_factory(owner=user_factory(), strategy="ddp", processes=1,
                             backend=Backend.SLURM, scheduler_job_id="77")  # fmt: skip
    workers = experiment_factory(owner=user_factory(), strategy="ddp", processes=1)
    for pk, priority in ((run.pk, -900), (workers.pk, 5)):
        with django_capture_on_commit_callbacks(execute=True):
            answer = staff.post(f"/api/queue/{pk}/priority/", json.dumps({"priority": priority}),
                                content_type="application/json")  # fmt: skip
        assert answer.status_code == 200, answer.content
    # The Slurm run's job only; a run on the workers has none.
    assert fake.calls("scontrol") == ["scontrol update JobId=77 Nice=900"]
    # Where the site's own --nice rules every job, a priority leaves it be.
    settings.TRAINYARD_SLURM_SBATCH_ARGS = "--account=ml --nice=50"
    with django_capture_on_commit_callbacks(execute=True):
        staff.post(f"/api/queue/{run.pk}/priority/", json.dumps({"priority": -10}),
                   content_type="application/json")  # fmt: skip
    assert len(fake.calls("scontrol")) == 1


def test_a_priority_changed_while_sbatch_runs_renices_the_new_job(
    user_factory: Any, experiment_factory: Any, fake: SlurmFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change finds no job to renice yet, and sbatch was asked with the priority before it:
    the submission sets the job's nice from the row's priority once it has the job."""
    from dashboard.experiments.runs.slurm import submit

    run = experiment_factory(owner=user_factory(), strategy="ddp", processes=1,
                             backend=Backend.SLURM, status=Status.QUEUED)  # fmt: skip
    sbatch = submit.slurm_job_submit

    def changed_meanwhile(request: Any) -> str:
        Experiment.objects.filter(pk=run.pk).update(priority=-40)  # the staff's, mid-sbatch
        return sbatch(request)

    monkeypatch.setattr(submit, "slurm_job_submit", changed_meanwhile)
    assert submit.slurm_run_submit(experiment_id=run.pk) == "4242"
    assert "--nice=0" in fake.calls("sbatch")[0].split()
    assert fake.calls("scontrol") == ["scontrol update JobId=4242 Nice=40"]


def _node_argv(*, command: list[str], tail: list[str], env: dict[str, str]) -> list[str]:
    """What the srun step's task runs on a node with Slurm's `env` there: the node shell of
    srun_command, run here (the real cluster's: tests/test_slurm.py)."""
    srun = srun_command(nodes=2, cwd="/", command=command, tail=tail)
    shell = srun[srun.index("bash") :]
    slurms = ("CUDA_VISIBLE_DEVICES", "SLURM_NODEID")
    clean = {k: v for k, v in os.environ.items() if k not in slurms}
    done = subprocess.run(shell, env={**clean, **env}, capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout))


def test_a_studys_runs_are_one_job_each(
    api: Any, fake: SlurmFake, django_capture_on_commit_callbacks: Any
) -> None:
    """A study whose base says backend slurm (issue 37, item 7): each of its runs is stored as a
    Slurm run and submitted as its own job, named for it."""
    body = {"name": "on the cluster", "target_accuracy": 0.5, "base": LAUNCH,
            "axes": {"lr": [0.1, 0.01]}}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/studies/", json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    runs = list(Experiment.objects.order_by("pk"))
    assert [(r.backend, r.lr, r.scheduler_job_id) for r in runs] == [
        (Backend.SLURM, 0.1, "4242"), (Backend.SLURM, 0.01, "4242"),
    ]  # fmt: skip
    names = [next(a for a in call.split() if a.startswith("--job-name=")) for call in
             fake.calls("sbatch")]  # fmt: skip
    assert names == [f"--job-name=ty-{r.pk}" for r in runs]


# The training's stand-in: its arguments, then the CUDA_VISIBLE_DEVICES it was started with.
ECHO = [sys.executable, "-c", "import json, os, sys; "
        "print(json.dumps([*sys.argv[1:], os.environ.get('CUDA_VISIBLE_DEVICES')]))"]  # fmt: skip


def test_a_node_trains_on_the_gpus_slurm_gave_it(settings: Any) -> None:
    """The job asks each node for as many GPUs as the run has (--gres); on each, the training
    takes the ones Slurm allocated there, whatever ids the run was launched with, and counts
    and narrows to them itself (Slurm's CUDA_VISIBLE_DEVICES would renumber them: ids 2,3
    under CUDA_VISIBLE_DEVICES=2,3 are no GPUs to the training's checks)."""
    request = JobRequest(
        experiment_id=3, nodes=2, ranks_per_node=2, gpus_per_node=2, partition="",
        time_limit_minutes=None, log=Path("x.out"),
    )  # fmt: skip
    assert "--gres=gpu:2" in sbatch_args(request)
    command, tail = [*ECHO, "--nproc", "2", "--gpus", "0,1"], ["--", "--gpus", "9"]
    second = _node_argv(command=command, tail=tail,
                        env={"SLURM_NODEID": "1", "CUDA_VISIBLE_DEVICES": "2,3"})  # fmt: skip
    # A script's own arguments after "--" are its own.
    assert second == ["--nproc", "2", "--gpus", "2,3", "--", "--gpus", "9", None]
    first = _node_argv(command=command, tail=tail,
                       env={"SLURM_NODEID": "0", "CUDA_VISIBLE_DEVICES": "0,1"})  # fmt: skip
    assert first == ["--nproc", "2", "--gpus", "0,1", "--rdzv-host", "--", "--gpus", "9", None]
    # A run on CPUs: nothing to take, whatever the node's environment says.
    cpu = _node_argv(command=[*ECHO, "--nproc", "2"], tail=[],
                     env={"SLURM_NODEID": "1", "CUDA_VISIBLE_DEVICES": "0"})  # fmt: skip
    assert cpu == ["--nproc", "2", "0"]
