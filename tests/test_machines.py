"""One run over two machines, end to end: launched through the API, placed on two workers (each
in a network namespace of its own, tests/machines_cluster.py), trained by torchrun's c10d
rendezvous across them, stopped, and surviving a machine's loss (worker killed, link cut).

Real processes throughout: PostgreSQL, Redis, daphne, Celery workers and beat, torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.bench_machines import figures_print
from tests.conftest import need
from tests.machines_cluster import Cluster, cluster_running, cluster_unavailable
from tests.stack import wait_for
from tests.test_exactness import assert_same_parameters
from tests.test_training import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

HEARTBEAT_BOUND = 8.0  # TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS below
REAPER_SECONDS = 2.0
# SGD and a fixed seed: a 2 x 1 run and a 1 x 2 run take the same steps (test_exactness.py).
JOB = {"strategy": "ddp", "processes": 1, "nodes": 2, "batch_size": 32, "optimizer": "sgd",
       "lr": 0.01, "seed": 7, "dataset": "mnist"}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, sample_data: Path) -> Iterator[Cluster]:
    reason = cluster_unavailable()
    need(reason is None, f"no test machines: {reason}")
    home = tmp_path_factory.mktemp("machines")
    env = {
        "TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS": str(HEARTBEAT_BOUND),
        "TRAINYARD_REAPER_SECONDS": str(REAPER_SECONDS),
        "TRAINYARD_WAIT_RETRY_SECONDS": "1",
        "TRAINYARD_DEVICE_REPORT_SECONDS": "2",
        "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER": "0",
        "TRAINYARD_LAUNCH_RATE_PER_MINUTE": "0",
    }
    with cluster_running(home=home, data_dir=sample_data, env=env) as running:
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


def checkpoint_logged(cluster: Cluster, pk: int, epoch: int) -> bool:
    return bool(cluster.query(
        "SELECT 1 FROM experiments_logline WHERE experiment_id = %s AND message LIKE %s",
        pk, f"checkpoint of epoch {epoch} %"))  # fmt: skip


def column(cluster: Cluster, pk: int, name: str) -> Any:
    (value,) = cluster.query(f"SELECT {name} FROM experiments_experiment WHERE id = %s", pk)[0]
    return json.loads(value) if isinstance(value, str) else value


def no_training_left(cluster: Cluster) -> bool:
    return not any(cluster.training_pids(m) for m in cluster.network.machines)


def test_a_two_machine_run_has_a_rank_on_each_machine_and_equals_one_machine(
    cluster: Cluster, sample_data: Path, tmp_path: Path
) -> None:
    """Slow (minutes on 2 cores): the first test of the module also waits for the cluster (initdb,
    migrations, both workers' first device reports), then one epoch is trained twice, over two
    machines through torchrun's c10d rendezvous and again on one machine with two ranks, to
    compare the parameters."""
    pk = launch(cluster, name="two machines", epochs=1)
    pids = training_on_both(cluster)
    # Each machine's processes live in that machine's network namespace, and no other.
    spaces = {name: {os.readlink(f"/proc/{p}/ns/net") for p in found if os.path.exists(
        f"/proc/{p}")} for name, found in pids.items()}  # fmt: skip
    first, second = spaces.values()
    assert len(first) == 1 and len(second) == 1 and first != second
    done = wait_status(cluster, pk, {"succeeded", "failed", "cancelled"}, timeout=600)
    assert done["status"] == "succeeded", done
    placement = {entry["worker"]: entry["ranks"] for entry in done["placement"]}
    assert sorted(placement) == sorted(m.name for m in cluster.network.machines)
    assert sorted(r for ranks in placement.values() for r in ranks) == [0, 1]
    assert all(len(ranks) == 1 for ranks in placement.values())
    # Both machines' output came back, each line tagged with the machine that relayed it.
    tagged = {row[0] for row in cluster.query(
        "SELECT DISTINCT machine FROM experiments_logline WHERE experiment_id = %s AND machine "
        "<> ''", pk)}  # fmt: skip
    assert tagged == set(placement)
    stats = column(cluster, pk, "rank_stats")
    assert {row["machine"] for row in stats["ranks"]} == set(placement)
    # The same job on one machine with two ranks ends with the same parameters.
    one = run_cli(
        sample_data, "--strategy", "ddp", "--nproc", "2", "--batch-size", "32", "--optimizer",
        "sgd", "--lr", "0.01", "--seed", "7", "--epochs", "1", "--checkpoint-dir",
        str(tmp_path), timeout=600,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]
    ours = cluster.runs_dir / str(pk) / "checkpoints" / "epoch-1.pt"
    assert_same_parameters(ours, tmp_path / "epoch-1.pt", rtol=1e-5)


def test_stop_ends_every_process_on_both_machines_within_5_seconds(cluster: Cluster) -> None:
    pk = launch(cluster, name="stopped", epochs=3)
    training_on_both(cluster)
    wait_for(lambda: run(cluster, pk).get("placement", [{}])[0].get("ranks"), timeout=240,
             what="the started event", interval=0.5)  # fmt: skip
    asked = time.monotonic()
    assert cluster.api("POST", f"/api/experiments/{pk}/stop/").status_code == 202
    wait_for(lambda: no_training_left(cluster), timeout=5, what="no training process left",
             interval=0.1)  # fmt: skip
    print(f"stop to no process on either machine: {time.monotonic() - asked:.1f} s")
    assert wait_status(cluster, pk, {"cancelled", "succeeded", "failed"}, 30)["status"] == (
        "cancelled"
    )


def _loses_then_resumes(cluster: Cluster, pk: int, cut: Any, heal: Any) -> None:
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
    done = wait_status(cluster, pk, {"succeeded", "failed", "cancelled"}, timeout=600)
    print(f"cut to resumed and succeeded: {time.monotonic() - cut_at:.1f} s")
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


def test_a_killed_worker_loses_the_run_which_resumes_on_both_machines(cluster: Cluster) -> None:
    """Slow (minutes on 2 cores): two attempts of a two-machine run, each starting torchrun on both
    machines; between them the heartbeat bound and the reaper pass before the loss is seen, then
    the second attempt resumes from epoch 1's checkpoint and trains to the end. FSDP2, so that a
    sharded model and optimizer, gathered into the checkpoint, resume across machines (DDP's
    loss and resume are the machines benchmark's last run, below)."""
    second = cluster.network.machines[1]
    pk = launch(cluster, name="worker killed", epochs=2, strategy="fsdp")

    def cut() -> None:
        cluster.services[second.name].kill()

    _loses_then_resumes(cluster, pk, cut, lambda: cluster.worker_start(second))


def test_a_machine_cut_off_loses_the_run_which_resumes_when_it_is_back(cluster: Cluster) -> None:
    """Slow (minutes on 2 cores), as the killed worker's test: two attempts, the heartbeat bound
    in between, and the cut-off machine's own ranks must end before its link is set up again.
    DDP with its options across machines: gradients sent as fp16 and the optimizer sharded
    (ZeroRedundancyOptimizer, its state consolidated into the checkpoint and resharded on
    resume)."""
    second = cluster.network.machines[1]
    pk = launch(cluster, name="link down", epochs=2, comm_hook="fp16", shard_optimizer=True)

    def heal() -> None:
        # Off the network, its own part ends within the bound (it cannot beat).
        wait_for(lambda: not cluster.training_pids(second), timeout=HEARTBEAT_BOUND + 40,
                 what="the cut-off machine ending its own ranks")  # fmt: skip
        second.link_set(up=True)

    _loses_then_resumes(cluster, pk, lambda: second.link_set(up=False), heal)


def test_a_rank_that_crashes_fails_the_run_and_ends_the_other_machines_ranks(
    cluster: Cluster,
) -> None:
    pk = launch(cluster, name="rank crashes", epochs=3)
    training_on_both(cluster)
    wait_for(lambda: run(cluster, pk).get("placement", [{}])[0].get("ranks"), timeout=240,
             what="the started event", interval=0.5)  # fmt: skip
    second = cluster.network.machines[1]

    def rank_pid() -> int | None:
        for pid in cluster.training_pids(second):
            try:
                if "RANK" in psutil.Process(pid).environ():
                    return pid
            except psutil.Error:
                continue
        return None

    os.kill(wait_for(rank_pid, timeout=30, what="a rank on the second machine"), signal.SIGKILL)
    done = wait_status(cluster, pk, {"failed", "succeeded", "cancelled", "queued"}, timeout=120)
    # A training that crashes is a failure, not a lost machine: nothing to resume.
    assert done["status"] == "failed", done
    wait_for(lambda: no_training_left(cluster), timeout=15, what="no training process left")


def test_the_machines_benchmark_measures_on_this_cluster(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m tests.bench_machines` as it measures, on this module's cluster (the command's
    own is the same, started fresh): three more runs (1 x 2 and 2 x 1 for an epoch, then 2 x 1
    with its second worker killed), so a change that breaks the benchmark breaks here. Last in
    the module: it leaves the resumed run to the teardown, as the command leaves it."""
    figures_print(cluster)
    out = capsys.readouterr().out
    s, ratio = r"\d+\.\d s", r"\d+\.\d\d"
    assert re.search(rf"^launch to first point: 1 machine x 2 ranks {s}, 2 machines x 1 rank "
                     rf"{s} \(x{ratio}\)$", out, re.M), out  # fmt: skip
    assert re.search(rf"^images/s \(epoch mean\): 1x2 \d+, 2x1 \d+ \(2x1 / 1x2 = {ratio}\)$",
                     out, re.M), out  # fmt: skip
    assert re.search(rf"^worker SIGKILLed: lost after {s}, resumed \(claimed again\) after {s}, "
                     rf"first point of the resumed attempt after {s} ", out, re.M), out  # fmt: skip
