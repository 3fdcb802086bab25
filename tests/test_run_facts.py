"""Protocol 1.1 facts: per-rank figures stored by the sink, shared tensors and stages shown."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.sink import EventSink, rank_stats_from_event
from dashboard.experiments.selectors import experiment_snapshot_build
from tests.test_devices import machine_make

pytestmark = pytest.mark.django_db

RANKS = [
    {
        "rank": 0,
        "images_per_second": 410.4,
        "data_seconds": 0.25,
        "compute_seconds": 0.75,
        "rss_bytes": 300 * 1024**2,
    },
    {
        "rank": 1,
        "images_per_second": 398.0,
        "data_seconds": 0.5,
        "compute_seconds": 0.5,
        "rss_bytes": 310 * 1024**2,
    },
]
TENSORS = [
    {
        "name": "train_images",
        "dtype": "uint8",
        "shape": [4000, 28, 28],
        "bytes": 3_136_000,
        "is_shared": True,
    },
    {"name": "train_labels", "dtype": "int64", "shape": [4000], "bytes": 32_000, "is_shared": True},
    {"name": "scratch", "dtype": "float32", "shape": [8], "bytes": 32, "is_shared": False},
]
STAGES = [{"name": "features", "device": "cpu"}, {"name": "classifier", "device": "cuda:0"}]


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_sink_keeps_the_latest_rank_figures(user_factory: Any, experiment_factory: Any) -> None:
    experiment = experiment_factory(owner=user_factory(), status="running")
    sink = EventSink(experiment)
    sink.add({"type": "step", "epoch": 1, "step": 10, "time": 1.0, "ranks": RANKS[:1]})
    sink.add({"type": "step", "epoch": 1, "step": 20, "time": 2.0, "ranks": RANKS})
    sink.flush()
    experiment.refresh_from_db()
    assert experiment.rank_stats["step"] == 20
    assert [r["rank"] for r in experiment.rank_stats["ranks"]] == [0, 1]
    assert experiment.rank_stats["ranks"][1]["data_seconds"] == 0.5
    # A later event without figures leaves them as they were.
    sink.add({"type": "step", "epoch": 1, "step": 30, "time": 3.0, "images_per_second": 800})
    sink.flush()
    experiment.refresh_from_db()
    assert experiment.rank_stats["step"] == 20 and experiment.step == 30


def test_rank_figures_are_cleaned() -> None:
    stats = rank_stats_from_event(
        {
            "type": "epoch",
            "step": 5,
            "ranks": [{"rank": True, "images_per_second": "fast", "rss_bytes": 7}, "junk"],
        }
    )
    assert stats is not None
    assert stats["ranks"] == [
        {
            "rank": 0,
            "images_per_second": None,
            "data_seconds": None,
            "compute_seconds": None,
            "rss_bytes": 7.0,
        }
    ]
    # One-process runs may send rank 0's own figures only.
    single = rank_stats_from_event(
        {"type": "step", "step": 1, "images_per_second": 90, "data_seconds": 0.1, "rss_bytes": 5}
    )
    assert single is not None and single["ranks"][0]["images_per_second"] == 90
    assert rank_stats_from_event({"type": "step", "step": 1, "images_per_second": 90}) is None


def test_sink_keeps_the_started_event_with_its_tensors(
    user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(owner=user_factory(), status="running")
    sink = EventSink(experiment)
    sink.add({"type": "started", "world_size": 2, "shared_tensors": TENSORS, "stages": STAGES})
    sink.flush()
    experiment.refresh_from_db()
    snapshot = experiment_snapshot_build(experiment=experiment, log_lines=10)
    assert snapshot["run"]["shared_tensors"] == TENSORS
    assert snapshot["run"]["stages"] == STAGES
    assert snapshot["rank_stats"] == {} and snapshot["checkpoints"] == []


def test_messages_carry_the_texts_the_page_shows(
    user_factory: Any, experiment_factory: Any
) -> None:
    """The page's script places these as they are: the texts are written once, here."""
    experiment = experiment_factory(owner=user_factory(), status="running")
    sink = EventSink(experiment)
    started = sink.add({"type": "started", "shared_tensors": TENSORS, "stages": STAGES})
    step = sink.add({"type": "step", "epoch": 1, "step": 20, "time": 2.0, "ranks": RANKS})
    bare = sink.add({"type": "step", "epoch": 1, "step": 30, "time": 3.0})
    sink.flush()
    shared = "3.0 MiB in shared memory: one copy, shared by every process."
    assert started["texts"]["shared_total_text"] == shared
    assert started["texts"]["shared_tensors"][0]["shape_text"] == "4000 × 28 × 28"
    [rank0, rank1] = step["texts"]["ranks"]
    assert rank0["split_text"] == "25% waiting for data, 75% computing"
    assert (rank1["ips_text"], rank1["data_text"], rank1["rss_text"]) == (
        "398",
        "0.50 s",
        "310.0 MiB",
    )
    assert "texts" not in bare  # no figures: the panel keeps the last ones
    experiment.refresh_from_db()
    snapshot = experiment_snapshot_build(experiment=experiment, log_lines=10)
    assert snapshot["texts"]["shared_total_text"] == shared
    assert [r["split_text"] for r in snapshot["texts"]["ranks"]] == [
        r["split_text"] for r in step["texts"]["ranks"]
    ]


def test_run_page_shows_tensors_stages_and_ranks(
    user_factory: Any, experiment_factory: Any
) -> None:
    experiment = experiment_factory(
        owner=user_factory(),
        strategy="model-parallel",
        processes=1,
        status="running",
        run_info={"world_size": 1, "shared_tensors": TENSORS, "stages": STAGES},
        rank_stats={"type": "step", "step": 40, "ranks": RANKS},
    )
    html = logged_in(experiment.owner).get(experiment.get_absolute_url()).content.decode()
    assert "train_images" in html and "4000 × 28 × 28" in html and "3.0 MiB" in html
    assert '<span class="badge warning">not shared</span>' in html
    # Only the shared ones count: images and labels.
    assert "3.0 MiB in shared memory" in html
    assert 'id="stages-box"' in html and "classifier" in html and "<code>cuda:0</code>" in html
    assert "at step 40" in html
    assert "300.0 MiB" in html and "310.0 MiB" in html and ">410<" in html
    assert "25% waiting for data, 75% computing" in html
    assert 'style="width: 25.0%"' in html and 'style="width: 75.0%"' in html
    assert "js/run_facts.js" in html


def test_run_page_without_facts_says_so(user_factory: Any, experiment_factory: Any) -> None:
    experiment = experiment_factory(owner=user_factory(), status="queued")
    html = logged_in(experiment.owner).get(experiment.get_absolute_url()).content.decode()
    assert "No per-rank figures yet" in html
    assert "no tensors in shared memory yet" in html
    assert 'id="stages-box" hidden' in html
    assert "No checkpoint yet" in html


def test_device_page_lists_shared_tensors_of_running_runs(
    user_factory: Any, experiment_factory: Any
) -> None:
    machine_make(hostname="box-1", cpu_count=4)
    alice, bob = user_factory(), user_factory()
    mine = experiment_factory(
        owner=alice,
        name="alice-hogwild",
        strategy="hogwild",
        status="running",
        worker="box-1",
        run_info={"shared_tensors": TENSORS[:1]},
    )
    experiment_factory(
        owner=bob,
        name="bob-secret",
        status="running",
        worker="box-1",
        run_info={"shared_tensors": TENSORS[1:2]},
    )
    experiment_factory(
        owner=alice,
        name="finished-one",
        status="succeeded",
        worker="box-1",
        run_info={"shared_tensors": TENSORS},
    )
    client = logged_in(alice)
    html = client.get(reverse("device-list")).content.decode()
    assert f'href="{mine.get_absolute_url()}"' in html and "alice-hogwild" in html
    assert "train_images" in html and "train_labels" in html
    assert "another user's run" in html and "bob-secret" not in html
    assert "finished-one" not in html
    [machine] = client.get(reverse("api-devices")).json()["machines"]
    names = [(r["name"], [t["name"] for t in r["shared_tensors"]]) for r in machine["runs"]]
    assert names == [("alice-hogwild", ["train_images"]), (None, ["train_labels"])]


def test_list_api_stays_lean(user_factory: Any, experiment_factory: Any) -> None:
    """The list polls every 2 s: per-rank figures stay out of it."""
    experiment: Experiment = experiment_factory(
        owner=user_factory(), rank_stats={"ranks": RANKS}, strategy="deepspeed", zero_stage=2
    )
    [row] = logged_in(experiment.owner).get("/api/experiments/").json()["experiments"]
    assert "rank_stats" not in row and row["zero_stage"] == 2
