"""A Slurm run's job on its page, live (issue 37, item 3): what the reconciler mirrors from squeue
reaches an open page over the run's socket as a `scheduler` message, and the snapshot and the
page's first HTML say the same line. Through the real ASGI application's consumer
(WebsocketCommunicator, the in-memory layer) with the cluster's commands as stand-ins
(tests/slurm_fake.py); the real cluster's page: tests/test_slurm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.utils import timezone

from dashboard.experiments.models import Backend, Status
from dashboard.experiments.runs.slurm.reconcile import slurm_reconcile
from tests.slurm_fake import SlurmFake, slurm_backend_fake
from tests.test_consumers import communicator

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> SlurmFake:
    return slurm_backend_fake(tmp_path, monkeypatch, settings)


async def test_the_reconcilers_change_of_the_job_reaches_the_open_page(
    user_factory: Any, experiment_factory: Any, fake: SlurmFake
) -> None:
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(
        owner=owner, processes=1, backend=Backend.SLURM, status=Status.QUEUED,
        scheduler_job_id="11", scheduler_state="PENDING", scheduler_reason="Priority",
        partition="debug", time_limit_minutes=30, heartbeat_at=timezone.now(),
    )  # fmt: skip
    comm = communicator(run.pk, owner)
    assert (await comm.connect())[0]
    snapshot = await comm.receive_json_from()
    assert snapshot["texts"]["scheduler"] == "11 (pending: Priority), partition debug, 30 min"

    # squeue: the job waits for nodes now.
    fake.command("squeue", out=f"11|ty-{run.pk}|PENDING|Resources\n")
    await sync_to_async(slurm_reconcile)()
    status, job = await comm.receive_json_from(), await comm.receive_json_from()
    assert status["type"] == "status" and status["reason"].endswith("pending: Resources")
    assert job["type"] == "scheduler" and job["seq"] == status["seq"] + 1
    assert job["scheduler"] == {"job_id": "11", "state": "PENDING", "reason": "Resources"}
    assert job["text"] == "11 (pending: Resources), partition debug, 30 min"
    # Nothing changed: a round says nothing.
    await sync_to_async(slurm_reconcile)()
    assert await comm.receive_nothing(timeout=0.3)

    # The job ended after its run (its supervisor settled it): its end, mirrored, is said too.
    await sync_to_async(type(run).objects.filter(pk=run.pk).update)(
        status=Status.SUCCEEDED, scheduler_state="RUNNING", scheduler_reason="",
        finished_at=timezone.now(),
    )  # fmt: skip
    fake.command("squeue", out=f"11|ty-{run.pk}|COMPLETED|None\n")
    await sync_to_async(slurm_reconcile)()
    ended = await comm.receive_json_from()
    assert ended["type"] == "scheduler" and ended["text"].startswith("11 (completed)"), ended
    await comm.disconnect()


def test_the_page_shows_the_snapshots_line(
    alice_client: Client, alice: Any, experiment_factory: Any, fake: SlurmFake
) -> None:
    """The first HTML says what the snapshot and the messages say (one home: texts.job_text)."""
    run = experiment_factory(owner=alice, processes=1, backend=Backend.SLURM,
                             scheduler_job_id="", partition="gpu")  # fmt: skip
    page = alice_client.get(f"/experiments/{run.pk}/").content.decode()
    assert '<dd id="info-scheduler">not submitted yet, partition gpu</dd>' in page
    workers = experiment_factory(owner=alice, processes=1)
    assert (
        'id="info-scheduler"'
        not in alice_client.get(f"/experiments/{workers.pk}/").content.decode()
    )
