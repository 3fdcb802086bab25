"""Scaling: throughput, speedup against the matching single run, efficiency, batch warnings."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from dashboard.experiments.metrics.throughput import (
    THROUGHPUT_RULE,
    THROUGHPUT_TITLE,
    throughput_of,
)
from dashboard.experiments.models import Experiment, SeriesPoint
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.selectors import experiment_snapshot_build

pytestmark = pytest.mark.django_db

CONFIG = {"dataset": "mnist", "epochs": 1, "batch_size": 64, "optimizer": "adam", "worker": "box"}


def run_make(owner: Any, *, ips: list[float], age: int = 0, **fields: Any) -> Experiment:
    """A run with step points at these images/s, plus an epoch point that must not count."""
    values: dict[str, Any] = {
        **CONFIG,
        "name": fields.get("strategy", "ddp"),
        "strategy": "ddp",
        "processes": 2,
        "status": "succeeded",
        "finished_at": timezone.now() - timedelta(minutes=age),
        "test_accuracy": 0.95,
    }
    values.update(fields)
    experiment = Experiment.objects.create(owner=owner, **values)
    for seq, value in enumerate(ips, start=1):
        SeriesPoint.objects.create(
            experiment=experiment, key="images_per_second", step=10 * seq, time=seq, value=value
        )
    # The epoch's own figures, as the sink stores them.
    last = 10 * len(ips)
    for key, value in (("test_loss", 0.2), ("test_accuracy", 0.95),
                       ("epoch/images_per_second", 99_999)):  # fmt: skip
        SeriesPoint.objects.create(experiment=experiment, key=key, step=last, time=99, value=value)
    return experiment


@pytest.fixture
def client(alice_client: Client) -> Client:
    return alice_client


@pytest.fixture
def runs(alice: Any, user_factory: Any) -> dict[str, Experiment]:
    bob = user_factory(username="bob")
    return {
        "older_single": run_make(alice, ips=[50], strategy="single", processes=1, age=60),
        "single": run_make(alice, ips=[200, 200], strategy="single", processes=1, age=30),
        # Newer, but not the same config, not finished, or not alice's: never the baseline.
        "single_b32": run_make(alice, ips=[10], strategy="single", processes=1, batch_size=32),
        "single_failed": run_make(alice, ips=[10], strategy="single", processes=1, status="failed"),
        "single_gpu": run_make(alice, ips=[10], strategy="single", processes=1, gpus=[0]),
        "single_elsewhere": run_make(alice, ips=[10], strategy="single", processes=1, worker="x"),
        "single_bob": run_make(bob, ips=[10], strategy="single", processes=1),
        "ddp": run_make(alice, ips=[360, 360], strategy="ddp", processes=2, test_accuracy=0.9),
        "dp": run_make(alice, ips=[210], strategy="dp", processes=1),
        "ddp_b128": run_make(alice, ips=[500], strategy="ddp", processes=2, batch_size=128),
    }


def compare(client: Client, *experiments: Experiment, api: bool = False) -> Any:
    ids = ",".join(str(e.pk) for e in experiments)
    name = "api-experiments-compare" if api else "experiment-compare"
    return client.get(reverse(name) + f"?ids={ids}")


def test_compare_api_numbers(client: Client, runs: dict[str, Experiment]) -> None:
    response = compare(client, runs["single"], runs["ddp"], runs["dp"], api=True)
    assert response.status_code == 200, response.content
    body = response.json()
    single, ddp, dp = body["runs"]
    assert single["throughput"] == pytest.approx(200)  # the step events', not the epoch's
    assert single["baseline"]["id"] == runs["single"].pk and single["speedup"] == pytest.approx(1)
    assert ddp["world_size"] == 2 and ddp["global_batch"] == 128
    assert ddp["baseline"] == {
        "id": runs["single"].pk,
        "url": runs["single"].get_absolute_url(),
        "throughput": pytest.approx(200),
        "global_batch": 64,
    }
    assert ddp["speedup"] == pytest.approx(1.8) and ddp["efficiency"] == pytest.approx(0.9)
    assert ddp["test_accuracy"] == pytest.approx(0.9)
    # DataParallel on the CPU: one device, its batch not multiplied.
    assert dp["world_size"] == 1 and dp["global_batch"] == 64
    assert dp["speedup"] == pytest.approx(1.05) and dp["efficiency"] == pytest.approx(1.05)
    assert "Global batch sizes differ" in body["batch_warning"]
    assert f"#{runs['ddp'].pk} ddp 128" in body["batch_warning"]
    assert body["missing"] == []


def test_throughput_is_the_images_over_the_time_that_trained_them(
    alice: Any, client: Client
) -> None:
    """Issue 34 item 2: one definition. Windows of 10 steps at 100 img/s and 300 img/s, then an
    epoch's short last window (2 steps at 50 img/s): 22 steps' images over their time, where
    the mean of the events said 150 and the last window 50."""
    run = run_make(alice, ips=[100, 300], strategy="single", processes=1)
    SeriesPoint.objects.create(experiment=run, key="images_per_second", step=22, time=3, value=50)
    expected = 22 / (10 / 100 + 10 / 300 + 2 / 50)
    assert throughput_of([(10, 100), (20, 300), (22, 50)]) == pytest.approx(expected)
    [row] = compare(client, run, api=True).json()["runs"]
    assert row["throughput"] == pytest.approx(expected)
    assert throughput_of([(10, 100), (10, 900), (5, 900)]) == pytest.approx(100)  # gone over
    assert throughput_of([]) is None


def test_the_batch_warning_speaks_of_the_strategies_compared(
    client: Client, runs: dict[str, Experiment]
) -> None:
    """Issue 34 item 8: DDP against a single device is not explained with DataParallel."""
    warning = compare(client, runs["single"], runs["ddp"], api=True).json()["batch_warning"]
    assert "more than their strategies (Single device and DistributedDataParallel)" in warning
    assert ("Each step here takes Single device one batch of 64; DistributedDataParallel 64 a "
            "process x 2 processes.") in warning  # fmt: skip
    assert "DataParallel " not in warning.replace("DistributedDataParallel", "")


def test_no_warning_when_the_global_batches_agree(
    client: Client, runs: dict[str, Experiment]
) -> None:
    body = compare(client, runs["single"], runs["dp"], api=True).json()
    assert body["batch_warning"] is None
    html = compare(client, runs["single"], runs["dp"]).content.decode()
    assert 'id="batch-warning"' not in html


def test_no_single_baseline(client: Client, runs: dict[str, Experiment]) -> None:
    body = compare(client, runs["ddp_b128"], api=True).json()
    [row] = body["runs"]
    assert row["baseline"] is None and row["speedup"] is None and row["efficiency"] is None
    assert row["throughput"] == pytest.approx(500)
    html = compare(client, runs["ddp_b128"]).content.decode()
    assert "no single baseline" in html


def test_reported_world_size_and_global_batch_win(alice: Any, client: Client) -> None:
    run_make(alice, ips=[100], strategy="single", processes=1)
    hogwild = run_make(
        alice,
        ips=[350],
        strategy="hogwild",
        processes=4,
        run_info={"world_size": 4, "global_batch_size": 64},
    )
    [row] = compare(client, hogwild, api=True).json()["runs"]
    assert row["world_size"] == 4 and row["global_batch"] == 64
    assert row["speedup"] == pytest.approx(3.5) and row["efficiency"] == pytest.approx(0.875)


def test_an_accumulating_runs_global_batch_counts_its_batches(alice: Any, client: Client) -> None:
    # Not yet started (no run_info): the configuration says 2 ranks x 2 batches of 32 a step.
    accumulating = run_make(alice, ips=[300], strategy="ddp", processes=2, accumulate=2)
    [row] = compare(client, accumulating, api=True).json()["runs"]
    assert row["global_batch"] == 2 * 2 * CONFIG["batch_size"]


@pytest.mark.parametrize(
    ("strategy", "processes", "nodes"),
    [("tensor-parallel", 2, 1), ("fsdp-tp", 4, 1), ("pipeline", 2, 1), ("ddp", 2, 2),
     ("single", 1, 1), ("dp", 1, 1)],
)  # fmt: skip
def test_a_queued_runs_global_batch_is_the_one_the_engine_reports(
    alice: Any, strategy: str, processes: int, nodes: int
) -> None:
    """Issue 34 item 11: a queued tensor-parallel run said 128 and 64 once it ran. Before the
    start the figure is computed as the engine's started event will say it (its ranks' plan)."""
    from types import SimpleNamespace

    from dashboard.experiments.metrics.scaling import experiment_global_batch
    from training.observe.reporting import started_fields
    from training.registry import mesh_shape, strategy_get

    queued = run_make(
        alice, ips=[100], strategy=strategy, processes=processes, nodes=nodes, batch_size=64,
        gpus=[0, 1] if strategy == "dp" else [],
    )  # fmt: skip
    world = processes * nodes if strategy_get(strategy).processes else 1
    # The engine's plan: a tensor-parallel group or a pipeline's ranks share one batch.
    batch_ranks = mesh_shape(strategy, world)[0]
    cfg = SimpleNamespace(
        strategy=strategy, dataset="mnist", data_path="", epochs=1, batch_size=64, accumulate=1,
        precision="fp32", compile=False, optimizer="adam", lr=0.001, seed=1, dry_run=False,
    )  # fmt: skip
    rt = SimpleNamespace(world_size=world, device_label="cpu")
    data = SimpleNamespace(source="", mode="", train=[0] * 10, test=[0] * 10)
    started = started_fields(cfg, rt, data, 1, 1, world=world, batch_ranks=batch_ranks)  # type: ignore[arg-type]
    assert experiment_global_batch(queued) == started["global_batch_size"]
    Experiment.objects.filter(pk=queued.pk).update(run_info=started)
    queued.refresh_from_db()
    assert experiment_global_batch(queued) == started["global_batch_size"]
    if strategy == "tensor-parallel":
        assert started["global_batch_size"] == 64


def test_compare_page_renders_the_table(client: Client, runs: dict[str, Experiment]) -> None:
    response = compare(client, runs["single"], runs["ddp"], runs["single_bob"])
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="compare-table"' in html and 'id="batch-warning"' in html
    assert "1.80×" in html and "90%" in html and "360 img/s" in html and "200 img/s" in html
    # Bob's run is not shown, and is not named either.
    assert f"Not shown: #{runs['single_bob'].pk}" in html
    assert response.context["missing"] == [runs["single_bob"].pk]


@pytest.mark.parametrize("query", ["?ids=1,x", "?ids=" + ",".join(str(i) for i in range(1, 30))])
def test_compare_refuses_bad_ids(client: Client, query: str) -> None:
    assert client.get(reverse("experiment-compare") + query).status_code == 400
    response = client.get(reverse("api-experiments-compare") + query)
    assert response.status_code == 400 and response.json()["errors"]["ids"]


def test_compare_takes_the_list_checkboxes(client: Client, runs: dict[str, Experiment]) -> None:
    query = f"?ids={runs['single'].pk}&ids={runs['ddp'].pk}"
    response = client.get(reverse("experiment-compare") + query)
    assert [row.experiment.pk for row in response.context["rows"]] == [
        runs["single"].pk,
        runs["ddp"].pk,
    ]
    empty = client.get(reverse("experiment-compare")).content.decode()
    assert "Nothing to compare yet" in empty


def test_list_page_links_to_compare(client: Client, runs: dict[str, Experiment]) -> None:
    html = client.get(reverse("experiment-list")).content.decode()
    assert f'action="{reverse("experiment-compare")}"' in html
    assert f'name="ids" value="{runs["ddp"].pk}" form="compare-form"' in html


def test_run_page_shows_its_scaling(client: Client, runs: dict[str, Experiment]) -> None:
    response = client.get(runs["ddp"].get_absolute_url())
    html = response.content.decode()
    assert 'id="scaling-speedup">1.80×<' in html
    assert 'id="scaling-efficiency">90%<' in html
    assert 'id="scaling-global-batch">128<' in html
    assert f'href="{runs["single"].get_absolute_url()}"' in html
    # Its global batch is twice the baseline's: said next to the figures.
    assert "global batch is 128 images, its baseline&#x27;s 64" in html
    assert response.context["initial"]["scaling"]["baseline"]["id"] == runs["single"].pk


def _window(step: int, ips: float) -> Any:
    """A step event of two even ranks at ``ips`` images/s together."""
    ranks = [{"rank": r, "images_per_second": ips / 2, "data_seconds": 0.1,
              "compute_seconds": 0.3, "rss_bytes": 1} for r in (0, 1)]  # fmt: skip
    return {"type": "step", "epoch": 1, "step": step, "time": float(step),
            "train_loss": 1.0, "images_per_second": ips, "ranks": ranks}  # fmt: skip


def test_the_headline_the_scaling_card_and_each_rank_say_one_throughput(
    alice: Any, client: Client
) -> None:
    """Issue 34 item 2: live (each step message), after a reload (the snapshot), on the Scaling
    card and in the Ranks table, the run's images/s over the training so far: the step-1 window
    at 50 img/s, 9 steps at 200, an epoch's short last window of 2 steps at 40."""
    run = run_make(alice, ips=[], strategy="ddp", processes=2, status="running")
    sink = EventSink(run)
    sent = [sink.add(_window(step, ips)) for step, ips in ((1, 50), (10, 200), (12, 40))]
    sink.flush()
    expected = 12 / (1 / 50 + 9 / 200 + 2 / 40)
    last = sent[-1]
    assert last["throughput"] == pytest.approx(expected)  # type: ignore[typeddict-item]
    each = f"{expected / 2:,.0f}"  # each rank's, over the same windows
    assert [row["ips_text"] for row in last["texts"]["ranks"]] == [each, each]  # type: ignore[typeddict-item]
    run.refresh_from_db()
    snapshot = experiment_snapshot_build(experiment=run, log_lines=10)
    assert snapshot["throughput"] == pytest.approx(expected)
    assert [row["ips_text"] for row in snapshot["texts"]["ranks"]] == [each, each]
    [row] = compare(client, run, api=True).json()["runs"]
    assert row["throughput"] == pytest.approx(expected)
    # The next attempt's supervisor (a sink of its own) goes on from the stored windows.
    again = EventSink(run).add(_window(20, 200))
    assert again["throughput"] == pytest.approx(20 / (1 / 50 + 17 / 200 + 2 / 40))  # type: ignore[typeddict-item]
    page = client.get(reverse("experiment-detail", args=[run.pk])).content.decode()
    named = f'title="{escape(THROUGHPUT_RULE)}">{THROUGHPUT_TITLE}<'
    assert page.count(named) == 2  # the headline's and the Scaling card's
    assert "img/s so far" in page  # the Ranks table's column
