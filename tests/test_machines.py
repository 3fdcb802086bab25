"""One run over two machines, end to end: launched through the API, placed on two workers (each
in a network namespace of its own, tests/machines_cluster.py), trained by torchrun's c10d
rendezvous across them, stopped, failed by a crashing rank, and surviving a machine cut off the
network. A worker killed, and the machines benchmark, are tests/test_machines_killed.py, on a
cluster of its own (tests/machines_runs.py), so that the two halves run on two xdist workers.

Real processes throughout: PostgreSQL, Redis, daphne, Celery workers and beat, torchrun."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.machines_cluster import Cluster
from tests.machines_runs import (
    HEARTBEAT_BOUND,
    cluster_fixture,  # noqa: F401 (the module's own cluster)
    column,
    launch,
    loses_then_resumes,
    no_training_left,
    run,
    training_on_both,
    wait_status,
)
from tests.stack import wait_for
from tests.test_exactness import assert_same_parameters
from tests.test_training import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# From `finished` stored to no training process left on either machine: the teardown bound
# (15 s) and a heartbeat or two.
NODES_END_SECONDS = 25


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
    finished = "training finished: %"
    wait_for(lambda: cluster.query("SELECT 1 FROM experiments_logline WHERE experiment_id = %s "
                                   "AND message LIKE %s", pk, finished),
             timeout=600, what="the run's finished event stored", interval=0.25)  # fmt: skip
    finished_at = time.monotonic()
    # Once `finished` is stored, both machines' processes end within seconds (Gloo's and
    # torchrun's teardown across machines took 33-46 s once; the supervisor's bound is
    # TRAINYARD_TEARDOWN_SECONDS, 15, and the other node follows at its next heartbeat).
    wait_for(lambda: no_training_left(cluster), timeout=NODES_END_SECONDS, interval=0.25,
             what="both machines' processes ended after `finished`")  # fmt: skip
    print(f"finished stored to no process left: {time.monotonic() - finished_at:.1f} s")
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

    loses_then_resumes(cluster, pk, lambda: second.link_set(up=False), heal)
