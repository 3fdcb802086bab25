"""The machines benchmark (`python -m tests.bench_machines`) on this module's cluster, and what its
three runs must do: 1 machine x 2 ranks and 2 machines x 1 rank train the same steps, the second
with a rank on each machine that ends within seconds of `finished`; then a run over both whose
second worker is SIGKILLed is lost within the heartbeat bound and resumes from its newest
checkpoint on both machines (FSDP2 here: a sharded model and optimizer, gathered into the
checkpoint, resume across machines).

The other half of the machine tests (stop, a crashing rank, a machine cut off) is
tests/test_machines.py; each file has a cluster of its own (tests/machines_runs.py), so that the
two run on two xdist workers at once. Real processes throughout: PostgreSQL, Redis, daphne,
Celery workers and beat, torchrun."""

from __future__ import annotations

import os
import re
import time

import pytest

from tests.bench_machines import figures_print
from tests.machines_cluster import Cluster
from tests.machines_runs import (
    HEARTBEAT_BOUND,
    REAPER_SECONDS,
    cluster_fixture,  # noqa: F401 (the module's own cluster)
    column,
    no_training_left,
    resumed_and_succeeded,
    run,
    training_on_both,
)
from tests.stack import wait_for
from tests.test_exactness import assert_same_parameters

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# From `finished` stored to no training process left on either machine: the teardown bound
# (15 s) and a heartbeat or two.
NODES_END_SECONDS = 25


def on_two_machines_while_training(cluster: Cluster, pk: int) -> None:
    """The 2 x 1 run, from its first point: each machine's processes in that machine's network
    namespace and no other; once `finished` is stored, both machines' processes end within
    seconds (Gloo's and torchrun's teardown across machines took 33-46 s once; the
    supervisor's bound is TRAINYARD_TEARDOWN_SECONDS, 15, and the other node follows at its
    next heartbeat)."""
    pids = training_on_both(cluster)
    spaces = {name: {os.readlink(f"/proc/{p}/ns/net") for p in found if os.path.exists(
        f"/proc/{p}")} for name, found in pids.items()}  # fmt: skip
    first, second = spaces.values()
    assert len(first) == 1 and len(second) == 1 and first != second
    wait_for(lambda: cluster.query("SELECT 1 FROM experiments_logline WHERE experiment_id = %s "
                                   "AND message LIKE %s", pk, "training finished: %"),
             timeout=600, what="the run's finished event stored", interval=0.25)  # fmt: skip
    finished_at = time.monotonic()
    wait_for(lambda: no_training_left(cluster), timeout=NODES_END_SECONDS, interval=0.25,
             what="both machines' processes ended after `finished`")  # fmt: skip
    print(f"finished stored to no process left: {time.monotonic() - finished_at:.1f} s")


def ran_on_both(cluster: Cluster, pk: int) -> None:
    """A rank on each machine, each machine's output relayed and tagged with it."""
    done = run(cluster, pk)
    placement = {entry["worker"]: entry["ranks"] for entry in done["placement"]}
    assert sorted(placement) == sorted(m.name for m in cluster.network.machines)
    assert sorted(r for ranks in placement.values() for r in ranks) == [0, 1]
    assert all(len(ranks) == 1 for ranks in placement.values())
    tagged = {row[0] for row in cluster.query(
        "SELECT DISTINCT machine FROM experiments_logline WHERE experiment_id = %s AND machine "
        "<> ''", pk)}  # fmt: skip
    assert tagged == set(placement)
    stats = column(cluster, pk, "rank_stats")
    assert {row["machine"] for row in stats["ranks"]} == set(placement)


def test_the_machines_benchmark_and_its_runs_over_two_machines(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slow (about 3 minutes on 2 cores): the benchmark as it measures (the command's own cluster
    is the same, started fresh), so a change that breaks it breaks here, and its three runs
    checked as they go: five torchrun starts over two machines, a heartbeat bound and the
    reaper between the killed run's two attempts, and one epoch each of the 1 x 2 and 2 x 1 runs
    and two of the killed one. The first test of the module also waits for the cluster (initdb,
    migrations, both workers' first device reports)."""
    figures = figures_print(
        cluster, killed_strategy="fsdp",
        watch=lambda pk: on_two_machines_while_training(cluster, pk),
    )  # fmt: skip
    out = capsys.readouterr().out
    print(out)
    s, ratio = r"(\d+\.\d) s", r"\d+\.\d\d"
    assert re.search(rf"^launch to first point: 1 machine x 2 ranks {s}, 2 machines x 1 rank "
                     rf"{s} \(x{ratio}\)$", out, re.M), out  # fmt: skip
    assert re.search(rf"^images/s \(epoch mean\): 1x2 \d+, 2x1 \d+ \(2x1 / 1x2 = {ratio}\)$",
                     out, re.M), out  # fmt: skip
    killed = re.search(rf"^worker SIGKILLed \(fsdp\): lost after {s}, the other machine's ranks "
                       rf"ended after {s}, resumed \(claimed again\) after {s}, first point of "
                       rf"the resumed attempt after {s} ", out, re.M)  # fmt: skip
    assert killed, out
    ran_on_both(cluster, figures.two)
    # SGD and one seed: the 2 x 1 run took the 1 x 2 run's steps (tests/test_exactness.py).
    one, two = (cluster.runs_dir / str(pk) / "checkpoints" / "epoch-1.pt"
                for pk in (figures.one, figures.two))  # fmt: skip
    assert_same_parameters(one, two, rtol=1e-5)
    # The killed run: lost within the bound, the other machine's ranks ended soon after.
    lost, others_ended = figures.killed.lost, figures.killed.others_ended
    assert lost < HEARTBEAT_BOUND + 4 * REAPER_SECONDS + 20, out
    assert others_ended - lost < 15, out
    resumed_and_succeeded(cluster, figures.killed.pk)
