"""A worker of a run over two machines SIGKILLed: the run is lost within the heartbeat bound and
resumes from its newest checkpoint on both machines (FSDP2 here; DDP in the machines benchmark,
`python -m tests.bench_machines`, measured below on this module's cluster).

The other half of the machine tests (the run itself, stop, a crashing rank, a machine cut off) is
tests/test_machines.py; each file has a cluster of its own (tests/machines_runs.py), so that the
two run on two xdist workers at once. Real processes throughout: PostgreSQL, Redis, daphne,
Celery workers and beat, torchrun."""

from __future__ import annotations

import re

import pytest

from tests.bench_machines import figures_print
from tests.machines_cluster import Cluster
from tests.machines_runs import (
    cluster_fixture,  # noqa: F401 (the module's own cluster)
    launch,
    loses_then_resumes,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


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

    loses_then_resumes(cluster, pk, cut, lambda: cluster.worker_start(second))


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
