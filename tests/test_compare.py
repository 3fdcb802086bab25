"""The compare page's charts: which runs it draws (only the viewer's), where their series and
live events come from, and the speedup and efficiency by world size beside them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.experiments.models import Experiment
from tests.test_scaling import run_make

pytestmark = pytest.mark.django_db


def compare(client: Client, *ids: int) -> Any:
    return client.get(reverse("experiment-compare") + "?ids=" + ",".join(map(str, ids)))


def embedded(html: str) -> dict[str, Any]:
    marker = 'id="compare-charts" type="application/json">'
    start = html.index(marker) + len(marker)
    data: dict[str, Any] = json.loads(html[start : html.index("</script>", start)])
    return data


@pytest.fixture
def client(alice_client: Client) -> Client:
    return alice_client


def test_the_charts_get_only_the_viewers_runs(
    client: Client, alice: Any, user_factory: Any
) -> None:
    bob = user_factory(username="bob")
    mine = run_make(alice, ips=[100.0], strategy="single", processes=1, name="mine single")
    running = run_make(alice, ips=[150.0], status="running", name="mine ddp")
    theirs = run_make(bob, ips=[400.0], name="bob's secret run")
    response = compare(client, mine.pk, running.pk, theirs.pk)
    html = response.content.decode()
    data = embedded(html)
    assert [run["id"] for run in data["runs"]] == [mine.pk, running.pk]
    assert "bob's secret run" not in html and f"/api/experiments/{theirs.pk}/" not in html
    assert response.context["missing"] == [theirs.pk]
    first, second = data["runs"]
    assert first["metrics_url"] == f"/api/experiments/{mine.pk}/metrics/"
    assert second["ws_path"] == f"/ws/experiments/{running.pk}/"
    # Live: only the run still training is followed over its socket.
    assert (first["active"], second["active"]) == (False, True)
    # What turns steps into images seen: DDP's batch per process times its 2 processes.
    assert (first["global_batch"], second["global_batch"]) == (64, 128)
    assert "js/charts.js" in html and "js/compare.js" in html
    assert "Images seen by default" in html


def test_speedup_and_efficiency_by_world_size(client: Client, alice: Any) -> None:
    single = run_make(alice, ips=[100.0], strategy="single", processes=1)
    ddp2 = run_make(alice, ips=[180.0], processes=2)
    ddp4 = run_make(alice, ips=[300.0], processes=4)
    other = run_make(alice, ips=[220.0], processes=4)
    scaling = embedded(compare(client, single.pk, ddp2.pk, ddp4.pk, other.pk).content.decode())
    chart = scaling["scaling"]
    assert chart["world_sizes"] == [1, 2, 4]
    lines = {line["strategy"]: line for line in chart["lines"]}
    assert lines["single"]["speedup"] == [1.0, None, None]
    # Two DDP runs of 4 processes: their mean (3.0x and 2.2x).
    assert lines["ddp"]["speedup"][0] is None
    assert lines["ddp"]["speedup"][1:] == pytest.approx([1.8, 2.6])
    assert lines["ddp"]["efficiency"][1:] == pytest.approx([0.9, 0.65])


def test_no_baseline_draws_no_scaling_line(client: Client, alice: Any) -> None:
    lonely = run_make(alice, ips=[180.0], processes=2)
    data = embedded(compare(client, lonely.pk).content.decode())
    assert data["scaling"] == {"world_sizes": [], "lines": []}
    assert Experiment.objects.count() == 1
