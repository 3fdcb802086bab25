"""Which ranks ran on which machine, as the run page says it (from the `started` event)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from dashboard.experiments.core.run_facts import machines_text
from dashboard.experiments.models import LogLine
from dashboard.experiments.runs.nodes import placement_with_ranks


def test_machines_text_names_each_machines_ranks() -> None:
    assert machines_text(["host-b", "host-a", "host-a"]) == "host-b: rank 0 · host-a: ranks 1, 2"
    assert machines_text(["host-a", "host-a"]) == ""  # one machine: nothing to say
    assert machines_text(None) == "" and machines_text("host-a") == ""


def test_placement_gets_the_ranks_the_rendezvous_gave() -> None:
    placement = [{"worker": "host-a", "node_rank": 0, "ranks": []},
                 {"worker": "host-b", "node_rank": 1, "ranks": []}]  # fmt: skip
    filled = placement_with_ranks(placement, ["host-b", "host-a"])
    assert [entry["ranks"] for entry in filled] == [[1], [0]]


@pytest.mark.django_db
def test_the_run_page_shows_the_ranks_of_each_machine(
    client: Any, user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    info = {"world_size": 2, "machines": ["host-b", "host-a"]}
    ranks = [{"rank": 0, "images_per_second": 10.0, "machine": "host-b"},
             {"rank": 1, "images_per_second": 9.0, "machine": "host-a"}]  # fmt: skip
    stats = {"type": "step", "step": 5, "ranks": ranks}
    run = experiment_factory(owner=alice, nodes=2, processes=1, status="running", run_info=info,
                             rank_stats=stats)  # fmt: skip
    LogLine.objects.create(experiment=run, seq=1, message="hello", rank=1, machine="host-a")
    client.force_login(alice)
    page = client.get(reverse("experiment-detail", args=[run.pk])).content.decode()
    assert 'id="info-machines">host-b: rank 0 · host-a: rank 1<' in page
    assert '<td>1 <span class="muted small">host-a</span></td>' in page  # the ranks table
    # Each log line says the machine that relayed it.
    assert '<span class="log-rank">r1</span><span class="log-machine">host-a</span>' in page
    one = experiment_factory(owner=alice, run_info={"machines": ["host-a", "host-a"]})
    assert (
        'id="info-machines"'
        not in client.get(reverse("experiment-detail", args=[one.pk])).content.decode()
    )


@pytest.mark.django_db
def test_the_device_page_lists_a_run_on_each_of_its_machines_with_its_ranks(
    user_factory: Any, experiment_factory: Any
) -> None:
    from dashboard.devices.views import running_shared_tensors

    alice = user_factory()
    tensor = {"name": "train.images", "bytes": 1024, "is_shared": True, "shape": [4, 1, 28, 28]}
    placement = [{"worker": "host-a", "ranks": [1]}, {"worker": "host-b", "ranks": [0]}]
    experiment_factory(owner=alice, nodes=2, processes=1, status="running", worker="host-a",
                       placement=placement, run_info={"shared_tensors": [tensor]})  # fmt: skip
    runs = running_shared_tensors(user=alice)
    assert {machine: [r["ranks_text"] for r in rows] for machine, rows in runs.items()} == {
        "host-a": ["rank 1"],
        "host-b": ["rank 0"],
    }
