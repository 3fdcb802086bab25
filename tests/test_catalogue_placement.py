"""Placement by what a machine can train (issue 17): a run goes only to machines whose report
has its model, its dataset and its image folder; a run over several machines needs them on
each; the waiting reason says what is missing where. The claim on the real database
(claim.experiment_claim), with machines as WorkerMachine rows (no network namespaces)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Experiment, Status
from dashboard.experiments.runs.claim import experiment_claim
from dashboard.experiments.scheduling.allocation import Machine
from tests.test_catalogue_launch import PETS, catalogue_report

pytestmark = pytest.mark.django_db

HOST_A = Machine("host-a", 4, frozenset())
HOST_B = Machine("host-b", 4, frozenset())


def row(name: str, report: dict[str, Any]) -> WorkerMachine:
    return WorkerMachine.objects.create(
        hostname=name, report=report, reported_at=timezone.now(), address=f"10.0.0.{name[-1]}"
    )


def queued(owner: Any, **fields: Any) -> Experiment:
    defaults: dict[str, Any] = {"name": "run", "strategy": "ddp", "processes": 1, "nodes": 1}
    return Experiment.objects.create(owner=owner, **{**defaults, **fields})


def test_a_machine_without_the_dataset_sends_the_run_to_one_that_has_it(
    user_factory: Any,
) -> None:
    row("host-a", catalogue_report(datasets=("mnist",), folders=()))
    row("host-b", catalogue_report())
    run = queued(user_factory(), model="resnet18", dataset="imagefolder", data_path=PETS)
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_A)
    assert not claim.claimed and claim.routed_to == "host-b"
    assert experiment_claim(experiment_id=run.pk, machine=HOST_B).claimed
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.worker == "host-b"


def test_where_no_machine_has_it_the_run_waits_saying_what_is_missing(
    user_factory: Any,
) -> None:
    row("host-a", catalogue_report(folders=(("/data/imagefolders/birds", 5),)))
    run = queued(user_factory(), dataset="imagefolder", data_path=PETS)
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_A)
    assert not claim.claimed and not claim.routed_to
    assert claim.waiting_reason == (
        f"waiting for a machine with what the run needs: host-a lacks image folder {PETS}"
    )
    run.refresh_from_db()
    assert run.status == Status.QUEUED and run.waiting_reason == claim.waiting_reason


def test_a_pinned_run_waits_for_its_machine_to_have_the_model(user_factory: Any) -> None:
    row("host-a", catalogue_report(models=("simple-cnn",)))
    row("host-b", catalogue_report())
    run = queued(user_factory(), model="resnet18", machines=["host-a"])
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_A)
    assert not claim.claimed and not claim.routed_to  # pinned: never sent elsewhere
    assert "host-a lacks model resnet18" in claim.waiting_reason


def test_a_multi_node_run_needs_the_model_on_every_machine(user_factory: Any) -> None:
    row("host-a", catalogue_report())
    row("host-b", catalogue_report(models=("simple-cnn",)))
    owner = user_factory()
    run = queued(owner, model="resnet18", nodes=2)
    claim = experiment_claim(experiment_id=run.pk, machine=HOST_A)
    assert not claim.claimed
    assert claim.waiting_reason == (
        "waiting for 2 machines with 1 free core each: host-b lacks model resnet18"
    )
    # The built-in is on both: the same run of simple-cnn spans them.
    plain = queued(owner, nodes=2)
    assert experiment_claim(experiment_id=plain.pk, machine=HOST_A).claimed
    plain.refresh_from_db()
    assert [p["worker"] for p in plain.placement] == ["host-a", "host-b"]


def test_an_old_report_takes_the_builtins_only(user_factory: Any) -> None:
    row("host-a", {"cpu_count": 4, "gpus": []})  # from a worker before the catalogue
    owner = user_factory()
    fancy = queued(owner, model="resnet18")
    claim = experiment_claim(experiment_id=fancy.pk, machine=HOST_A)
    assert not claim.claimed and "host-a lacks model resnet18" in claim.waiting_reason
    plain = queued(owner, dataset="fashion-mnist")
    assert experiment_claim(experiment_id=plain.pk, machine=HOST_A).claimed
