"""Figures of runs over two machines, measured side by side on this host (two network namespaces
as machines, tests/machines_cluster.py; needs root and PostgreSQL):

    .venv/bin/python -m tests.bench_machines

prints launch to first point and the epoch's images/s of 1 machine x 2 ranks and 2 machines x 1
rank (same seed and global batch), their ratio, and for a 2-machine run whose second worker is
SIGKILLed after its first epoch: kill to lost, to the other machine's ranks ended, to resumed
(claimed again) and to the resumed attempt's first point. Both "machines" share this host's
cores: the ratio shows the cost of the rendezvous and the network path, not what two real
machines would gain.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.machines_cluster import Cluster, cluster_running, cluster_unavailable
from tests.stack import wait_for

JOB = {"strategy": "ddp", "batch_size": 32, "optimizer": "sgd", "lr": 0.01, "seed": 7,
       "dataset": "mnist", "epochs": 1}  # fmt: skip
ENV = {"TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS": "8", "TRAINYARD_REAPER_SECONDS": "2",
       "TRAINYARD_DEVICE_REPORT_SECONDS": "2",
       "TRAINYARD_MAX_ACTIVE_RUNS_PER_USER": "0",
       "TRAINYARD_LAUNCH_RATE_PER_MINUTE": "0"}  # fmt: skip


def _one(cluster: Cluster, sql: str, *params: Any) -> Any:
    rows = cluster.query(sql, *params)
    return rows[0][0] if rows else None


def _first_point_id(cluster: Cluster, pk: int, after_id: int = 0) -> Any:
    return _one(cluster, "SELECT min(id) FROM experiments_seriespoint WHERE experiment_id = %s "
                "AND key = 'train_loss' AND id > %s", pk, after_id)  # fmt: skip


def _launch(cluster: Cluster, **fields: Any) -> tuple[int, float]:
    response = cluster.api("POST", "/api/experiments/", json={**JOB, **fields})
    assert response.status_code == 201, response.text
    return int(response.json()["id"]), time.monotonic()


def _status(cluster: Cluster, pk: int) -> tuple[str, int]:
    body = cluster.api("GET", f"/api/experiments/{pk}/").json()
    return str(body["status"]), int(body["attempt"])


FINAL = {"succeeded", "failed", "cancelled"}


def _succeeded(cluster: Cluster, pk: int, *, timeout: float) -> None:
    """Waits for the run's end, which must be a success: a failure says so at once."""
    wait_for(lambda: _status(cluster, pk)[0] in FINAL, timeout=timeout, what=f"run {pk}'s end",
             interval=0.5)  # fmt: skip
    body = cluster.api("GET", f"/api/experiments/{pk}/").json()
    if body["status"] != "succeeded":
        raise AssertionError(f"run {pk} ended {body['status']}: {body}\n{cluster.diagnostics()}")


def run_figures(
    cluster: Cluster, *, nodes: int, processes: int, watch: Callable[[int], None] | None = None
) -> tuple[int, float, float]:
    """The run's id, its launch to first point and its epoch's images/s. ``watch(pk)`` is called
    once the first point is stored (the machine tests look at the run while it trains)."""
    pk, launched = _launch(cluster, name=f"{nodes}x{processes}", nodes=nodes, processes=processes)
    wait_for(lambda: _first_point_id(cluster, pk), timeout=400, what="the first point")
    first = time.monotonic() - launched
    if watch is not None:
        watch(pk)
    _succeeded(cluster, pk, timeout=900)
    ips = _one(cluster, "SELECT value FROM experiments_seriespoint WHERE experiment_id = %s AND "
               "key = 'epoch/images_per_second'", pk)  # fmt: skip
    return pk, first, float(ips)


@dataclass(frozen=True)
class Killed:
    """The killed run's id and its seconds from the kill: to lost, to the other machine's ranks
    of the lost attempt ended, to resumed (claimed again), to the resumed attempt's first point."""

    pk: int
    lost: float
    others_ended: float
    resumed: float
    point: float


def kill_figures(cluster: Cluster, *, strategy: str = "ddp") -> Killed:
    first, second = cluster.network.machines[:2]
    pk, _ = _launch(cluster, name="killed", nodes=2, processes=1, epochs=2, strategy=strategy)
    wait_for(lambda: cluster.query("SELECT 1 FROM experiments_checkpoint WHERE experiment_id = %s",
             pk), timeout=900, what="epoch 1's checkpoint", interval=0.2)  # fmt: skip
    last = _one(cluster, "SELECT max(id) FROM experiments_seriespoint") or 0
    others = cluster.training_pids(first)  # the attempt's launcher and rank there
    assert others, "no process of the run on the first machine"
    killed = time.monotonic()
    cluster.services[second.name].kill()
    wait_for(lambda: _status(cluster, pk)[1] > 1 or _status(cluster, pk)[0] != "running",
             timeout=120, what="lost", interval=0.1)  # fmt: skip
    lost = time.monotonic() - killed
    # Ended, not left blocked in a collective with a rank that is gone.
    wait_for(lambda: not others & cluster.training_pids(first), timeout=60, interval=0.1,
             what="the other machine's ranks of the lost attempt ended")  # fmt: skip
    others_ended = time.monotonic() - killed
    cluster.worker_start(second)
    again = wait_for(lambda: (s := _status(cluster, pk))[1] >= 2 and s[0] != "queued" and s,
                     timeout=300, what="resumed", interval=0.2)  # fmt: skip
    resumed = time.monotonic() - killed
    assert again in (("running", 2), ("succeeded", 2)), (again, cluster.diagnostics())
    wait_for(lambda: _first_point_id(cluster, pk, last), timeout=400, what="a resumed point",
             interval=0.2)  # fmt: skip
    return Killed(pk, lost, others_ended, resumed, time.monotonic() - killed)


@dataclass(frozen=True)
class Figures:
    one: int  # the ids of the 1 x 2 and the 2 x 1 runs
    two: int
    killed: Killed


def figures_print(
    cluster: Cluster, *, killed_strategy: str = "ddp", watch: Callable[[int], None] | None = None
) -> Figures:
    """Measures and prints the figures on a running cluster whose two workers have reported
    (main's own, or the machine tests' cluster, which runs this as a test: FSDP2 for the killed
    run there, and ``watch`` looking at the 2 x 1 run while it trains)."""
    one, one_first, one_ips = run_figures(cluster, nodes=1, processes=2)
    two, two_first, two_ips = run_figures(cluster, nodes=2, processes=1, watch=watch)
    print(
        f"launch to first point: 1 machine x 2 ranks {one_first:.1f} s, "
        f"2 machines x 1 rank {two_first:.1f} s (x{two_first / one_first:.2f})"
    )
    print(
        f"images/s (epoch mean): 1x2 {one_ips:.0f}, 2x1 {two_ips:.0f} "
        f"(2x1 / 1x2 = {two_ips / one_ips:.2f})"
    )
    killed = kill_figures(cluster, strategy=killed_strategy)
    print(
        f"worker SIGKILLed ({killed_strategy}): lost after {killed.lost:.1f} s, the other "
        f"machine's ranks ended after {killed.others_ended:.1f} s, resumed (claimed again) after "
        f"{killed.resumed:.1f} s, first point of the resumed attempt after {killed.point:.1f} s "
        f"(heartbeat bound {ENV['TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS']} s, reaper every "
        f"{ENV['TRAINYARD_REAPER_SECONDS']} s)"
    )
    return Figures(one, two, killed)


def main() -> int:
    reason = cluster_unavailable()
    if reason:
        print(f"cannot measure: {reason}")
        return 1
    home = Path(tempfile.mkdtemp(prefix="trainyard-bench-machines-"))
    data = Path(tempfile.mkdtemp(prefix="trainyard-bench-data-"))
    with cluster_running(home=home, data_dir=data, env=ENV) as cluster:
        cluster.manage("shell", "-c", "from django.contrib.auth import get_user_model as g;"
                       "g().objects.create_user('bench', password='pw-bench')")  # fmt: skip
        cluster.token = cluster.manage("create_token", "bench").strip()
        wait_for(lambda: len(cluster.query("SELECT 1 FROM devices_workermachine")) == 2,
                 timeout=120, what="both workers")  # fmt: skip
        figures_print(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
