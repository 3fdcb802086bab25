"""What the machine tests share (tests/test_machines.py, tests/test_machines_killed.py): a cluster
of two machines per test module, so that the two files run on two xdist workers at once, and
the steps of a run over them (launch, read, wait) through the API and the database.

A module's cluster costs its set-up (PostgreSQL's initdb, migrations, both workers' first device
reports) once; the two files' tests take minutes each, so a second cluster is cheap beside the
half of the tests that another worker takes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bench_machines import ENV
from tests.conftest import need
from tests.machines_cluster import Cluster, cluster_running, cluster_unavailable
from tests.stack import wait_for

HEARTBEAT_BOUND = float(ENV["TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS"])
REAPER_SECONDS = float(ENV["TRAINYARD_REAPER_SECONDS"])
# SGD and a fixed seed: a 2 x 1 run and a 1 x 2 run take the same steps (test_exactness.py).
JOB = {"strategy": "ddp", "processes": 1, "nodes": 2, "batch_size": 32, "optimizer": "sgd",
       "lr": 0.01, "seed": 7, "dataset": "mnist"}  # fmt: skip


@pytest.fixture(scope="module", name="cluster")
def cluster_fixture(
    tmp_path_factory: pytest.TempPathFactory, few_test_digits: Path
) -> Iterator[Cluster]:
    """Imported by each machine test module, which gets a cluster of its own (module scope).
    Its runs evaluate on 200 test digits (tests/conftest.py): what they check is equalities
    between runs and what the machines do."""
    reason = cluster_unavailable()
    need(reason is None, f"no test machines: {reason}")
    home = tmp_path_factory.mktemp("machines")
    with cluster_running(home=home, data_dir=few_test_digits, env=dict(ENV)) as running:
        running.manage("shell", "-c", "from django.contrib.auth import get_user_model as g;"
                       "g().objects.create_user('alice', password='pw-alice')")  # fmt: skip
        running.token = running.manage("create_token", "alice").strip()
        names = sorted(m.name for m in running.network.machines)
        try:
            wait_for(lambda: sorted(r[0] for r in running.query(
                "SELECT hostname FROM devices_workermachine")) == names,
                timeout=120, what="both workers' device reports", interval=0.5)  # fmt: skip
        except TimeoutError:
            raise RuntimeError(running.diagnostics()) from None
        yield running


def launch(cluster: Cluster, **fields: Any) -> int:
    response = cluster.api("POST", "/api/experiments/", json={**JOB, **fields})
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def run(cluster: Cluster, pk: int) -> dict[str, Any]:
    response = cluster.api("GET", f"/api/experiments/{pk}/")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_status(cluster: Cluster, pk: int, statuses: set[str], timeout: float) -> dict[str, Any]:
    try:
        return wait_for(lambda: (r := run(cluster, pk))["status"] in statuses and r,
                        timeout=timeout, what=f"run {pk} {statuses}", interval=0.5)  # fmt: skip
    except TimeoutError:
        raise AssertionError(f"{run(cluster, pk)}\n{cluster.diagnostics()}") from None


def training_on_both(cluster: Cluster) -> dict[str, set[int]]:
    def found() -> dict[str, set[int]] | None:
        pids = {m.name: cluster.training_pids(m) for m in cluster.network.machines}
        return pids if all(pids.values()) else None

    return wait_for(found, timeout=240, what="training processes on both machines", interval=0.5)


def column(cluster: Cluster, pk: int, name: str) -> Any:
    (value,) = cluster.query(f"SELECT {name} FROM experiments_experiment WHERE id = %s", pk)[0]
    return json.loads(value) if isinstance(value, str) else value


def no_training_left(cluster: Cluster) -> bool:
    return not any(cluster.training_pids(m) for m in cluster.network.machines)


def checkpoint_logged(cluster: Cluster, pk: int, epoch: int) -> bool:
    return bool(cluster.query(
        "SELECT 1 FROM experiments_logline WHERE experiment_id = %s AND message LIKE %s",
        pk, f"checkpoint of epoch {epoch} %"))  # fmt: skip


def loses_then_resumes(cluster: Cluster, pk: int, cut: Any, heal: Any) -> None:
    """Run ``pk`` (two epochs over both machines) loses the second by ``cut`` once epoch 1's
    checkpoint is written, is seen lost within the bound, and succeeds once ``heal`` brings the
    machine back: resumed from that checkpoint, model and optimizer both."""
    wait_for(lambda: checkpoint_logged(cluster, pk, 1), timeout=400, what="epoch 1's checkpoint",
             interval=0.5)  # fmt: skip
    first = cluster.network.machines[0]
    survivors = cluster.training_pids(first)  # the first attempt's launcher and rank there
    assert survivors
    cut_at = time.monotonic()
    cut()
    lost = wait_for(lambda: (r := run(cluster, pk))["attempt"] > 1 or r["status"] != "running",
                    timeout=HEARTBEAT_BOUND + 60, what="the run lost", interval=0.25)  # fmt: skip
    lost_after = time.monotonic() - cut_at
    # The surviving machine's ranks are ended, not left blocked in a collective.
    wait_for(lambda: not survivors & cluster.training_pids(first), timeout=15,
             what="no rank of the lost attempt left on the surviving machine")  # fmt: skip
    print(f"cut to lost: {lost_after:.1f} s (bound {HEARTBEAT_BOUND} s)")
    assert lost_after < HEARTBEAT_BOUND + 4 * REAPER_SECONDS + 20, lost
    heal()
    resumed_and_succeeded(cluster, pk)
    print(f"cut to resumed and succeeded: {time.monotonic() - cut_at:.1f} s")


def resumed_and_succeeded(cluster: Cluster, pk: int) -> None:
    """Run ``pk``, lost once, ends as a success: its second attempt resumed from the checkpoint,
    model and optimizer both."""
    done = wait_status(cluster, pk, {"succeeded", "failed", "cancelled"}, timeout=600)
    assert done["status"] == "succeeded", done
    history = column(cluster, pk, "attempts")
    assert history[0]["outcome"] == "lost" and history[-1]["outcome"] == "succeeded", history
    resumed = cluster.query(
        "SELECT 1 FROM experiments_logline WHERE experiment_id = %s AND message LIKE %s",
        pk, "%esum%")  # fmt: skip
    assert resumed, "the second attempt said nothing of resuming"
    # The model and the optimizer both came back from the checkpoint (a strategy whose state
    # could not be restored says the optimizer "starts afresh").
    afresh = cluster.query(
        "SELECT message FROM experiments_logline WHERE experiment_id = %s AND message LIKE %s",
        pk, "%afresh%")  # fmt: skip
    assert not afresh, afresh
