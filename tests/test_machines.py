"""One run over two machines, launched through the API, placed on two workers (each in a network
namespace of its own, tests/machines_cluster.py) and trained by torchrun's c10d rendezvous
across them: stopped, failed by a crashing rank, and surviving a machine cut off the network.
The machines benchmark, whose runs are checked as they go (one over two machines equal to one on
one machine, a worker killed), is tests/test_machines_killed.py, on a cluster of its own
(tests/machines_runs.py), so that the two halves run on two xdist workers.

Real processes throughout: PostgreSQL, Redis, daphne, Celery workers and beat, torchrun."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from tests.machines_cluster import Cluster
from tests.machines_runs import (
    HEARTBEAT_BOUND,
    cluster_fixture,  # noqa: F401 (the module's own cluster)
    launch,
    loses_then_resumes,
    no_training_left,
    run,
    training_on_both,
    wait_status,
)
from tests.stack import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_stop_ends_every_process_on_both_machines_within_5_seconds(cluster: Cluster) -> None:
    """The first test of the module also waits for the cluster (initdb, migrations, both
    workers' first device reports)."""
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
