"""Where each step's time goes, seen where decisions are made (issue 19, part 4): the shares of
communication, data and waiting and the efficiency sentence over figures (metrics/phases.py);
the breakdown of many runs in one query; the run page's phases partial and facts; the compare
page's, a study's and their JSON's shares and sentences; the exports carrying the phase series.
The points are stored as the sink stores them (tests/phase_runs.py): no training here."""

from __future__ import annotations

import csv
import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dashboard.experiments.metrics.breakdown import (
    PHASES,
    RankBreakdown,
    experiment_breakdown,
    experiments_breakdown,
)
from dashboard.experiments.metrics.phases import (
    NOT_MEASURED,
    RunShares,
    efficiency_reason_text,
    run_shares,
    shares_pooled,
    shares_text,
)
from dashboard.experiments.metrics.series_contract import PHASE_FIELDS
from dashboard.experiments.models import Experiment, SeriesPoint, Status
from tests.phase_runs import BYTES_PER_STEP, WINDOW_STEPS, phase_points_add, phase_run_make

ROOT = Path(__file__).resolve().parent.parent


def entry(rank: int, **shares: float) -> RankBreakdown:
    rest = 1 - sum(shares.values())
    return RankBreakdown(
        rank=rank, **{"forward": 0.0, "backward": 0.0, "optimizer": 0.0, "other": rest, **shares}
    )  # type: ignore[typeddict-item]


# Rank 0 sits 0.30 of its time in all-reduce, rank 1 (the slow one) 0.12: rank 1's is the
# transfer, rank 0's extra 0.18 is waiting for rank 1; over the two ranks 0.09 on average.
TWO_RANKS = [
    entry(0, data=0.10, communication=0.30, forward=0.2),
    entry(1, data=0.08, communication=0.12, forward=0.3),
]


# --- the pure functions ------------------------------------------------------------------------


def test_shares_tell_the_transfer_from_the_waiting_for_the_slow_rank() -> None:
    shares = run_shares(TWO_RANKS)
    assert shares == RunShares(communication=0.12, data=0.09, waiting=0.09, waiting_for=1)
    assert shares_text(shares) == "12% communication · 9% data · 9% waiting for rank 1"


def test_one_rank_waits_for_nobody_and_no_phases_give_none() -> None:
    alone = run_shares([entry(0, data=0.2, communication=0.0)])
    assert alone == RunShares(communication=0.0, data=0.2, waiting=0.0, waiting_for=None)
    assert "waiting 0%" not in shares_text(alone) and shares_text(alone).endswith("0% waiting")
    assert run_shares([]) is None and shares_text(None) == "—"
    # Even ranks, within the noise: waiting but nobody named.
    even = run_shares(
        [entry(0, data=0.1, communication=0.205), entry(1, data=0.1, communication=0.2)]
    )
    assert even is not None and even["waiting_for"] is None and even["waiting"] == 0.0025


def test_a_cells_shares_are_the_mean_over_its_seeds_naming_the_rank_of_the_most_waiting() -> None:
    a = RunShares(communication=0.2, data=0.1, waiting=0.02, waiting_for=1)
    b = RunShares(communication=0.4, data=0.3, waiting=0.10, waiting_for=0)
    assert shares_pooled([a, b]) == RunShares(
        communication=0.3, data=0.2, waiting=0.06, waiting_for=0
    )
    assert shares_pooled([]) is None


def test_the_sentence_says_what_efficiency_lost_to() -> None:
    figures = RunShares(communication=0.31, data=0.09, waiting=0.08, waiting_for=1)
    assert efficiency_reason_text(efficiency=0.52, shares=figures) == (
        "efficiency 52%: 31% communication, 9% data, 8% waiting for rank 1"
    )
    assert efficiency_reason_text(efficiency=0.52, shares=run_shares(TWO_RANKS)) == (
        "efficiency 52%: 12% communication, 9% data, 9% waiting for rank 1"
    )
    assert efficiency_reason_text(efficiency=0.9, shares=None) == f"efficiency 90%: {NOT_MEASURED}"
    assert efficiency_reason_text(efficiency=None, shares=figures) is None


# --- the breakdown of many runs ----------------------------------------------------------------


@pytest.mark.django_db
def test_many_runs_breakdown_in_one_query_as_each_runs_own(
    alice: Any, django_assert_num_queries: Any
) -> None:
    ids = [phase_run_make(owner="alice", name=f"r{i}", windows=i + 1) for i in range(3)]
    old = phase_run_make(owner="alice", name="before 1.9")
    with django_assert_num_queries(1):
        found = experiments_breakdown(experiment_ids=[*ids, old])
    assert sorted(found) == ids  # the run without phases has no entry
    for pk in ids:
        assert found[pk] == experiment_breakdown(experiment=Experiment.objects.get(pk=pk))
        assert [e["rank"] for e in found[pk]] == [0, 1]


# --- the run page --------------------------------------------------------------------------------


def embedded(html: str, element_id: str) -> Any:
    found = re.search(
        rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S
    )
    assert found, f"no {element_id} in the page"
    return json.loads(found[1])


@pytest.mark.django_db
def test_the_page_facts_carry_each_phases_label_colour_and_stored_field(
    alice_client: Client,
) -> None:
    facts = embedded(alice_client.get(reverse("experiment-list")).content.decode(), "page-facts")
    phases = facts["phases"]["phases"]
    assert [p["name"] for p in phases] == list(PHASES)
    # The fields are the ones the sink stores per rank, so the page files points under them.
    assert {p["field"] for p in phases} == {"data_seconds", *PHASE_FIELDS} - {"communication_bytes"}
    assert facts["phases"]["bytes_field"] in PHASE_FIELDS
    css = (ROOT / "static/css/app.css").read_text()
    for phase in phases:
        assert phase["label"] and re.search(rf"{phase['color']}:\s*#", css), phase


@pytest.mark.django_db
def test_the_run_page_has_the_phases_partial_and_its_snapshot_the_points(
    alice_client: Client,
) -> None:
    pk = phase_run_make(owner="alice", name="ddp", windows=3)
    html = alice_client.get(reverse("experiment-detail", args=[pk])).content.decode()
    assert 'id="phases"' in html and "js/phases.js" in html
    snapshot = embedded(html, "experiment-snapshot")
    # What phases.js draws from: every rank's phase series and the run's breakdown.
    for rank in (0, 1):
        for field in ("data_seconds", *PHASE_FIELDS):
            buckets = snapshot["series"][f"rank/{rank}/{field}"]["buckets"]
            assert [b[1] for b in buckets] == [10, 20, 30]
    assert [e["rank"] for e in snapshot["experiment"]["breakdown"]] == [0, 1]
    bytes_last = snapshot["series"]["rank/0/communication_bytes"]["buckets"][-1][7]
    assert bytes_last == BYTES_PER_STEP * WINDOW_STEPS
    old = phase_run_make(owner="alice", name="old")
    html = alice_client.get(reverse("experiment-detail", args=[old])).content.decode()
    assert embedded(html, "experiment-snapshot")["experiment"]["breakdown"] == []


# --- compare and studies ---------------------------------------------------------------------


@pytest.mark.django_db
def test_compare_gives_each_runs_shares_beside_its_throughput(alice_client: Client) -> None:
    measured = phase_run_make(owner="alice", name="measured", windows=2)
    old = phase_run_make(owner="alice", name="old")
    body = alice_client.get(reverse("api-experiments-compare") + f"?ids={measured},{old}").json()
    first, second = body["runs"]
    breakdown = experiment_breakdown(experiment=Experiment.objects.get(pk=measured))
    # By hand: the transfer is the least communication share, the waiting the mean excess.
    least = min(e["communication"] for e in breakdown)
    assert first["phase_shares"]["communication"] == pytest.approx(least, abs=1e-4)
    assert first["phase_shares"]["waiting"] == pytest.approx(
        sum(e["communication"] - least for e in breakdown) / 2, abs=1e-4
    )
    assert first["phase_shares"]["waiting_for"] == 1
    assert second["phase_shares"] is None
    page = alice_client.get(reverse("experiment-compare") + f"?ids={measured},{old}")
    assert shares_text(run_shares(breakdown)) in page.content.decode()


TWO_BY_ONE = {
    "name": "ddp scaling",
    "base": {"dataset": "mnist", "epochs": 1, "batch_size": 64},
    "axes": {"strategy": ["single", "ddp"]},
    "target_accuracy": 0.9,
}


@pytest.mark.django_db
def test_a_studys_cells_and_scaling_view_say_what_efficiency_lost_to(
    alice_client: Client, launched: Any
) -> None:
    body = alice_client.post(
        reverse("api-studies"), json.dumps(TWO_BY_ONE), content_type="application/json"
    ).json()
    single, ddp = (Experiment.objects.get(pk=pk) for pk in body["runs"])
    for run, ips in ((single, 400.0), (ddp, 520.0)):
        SeriesPoint.objects.create(
            experiment=run, key="images_per_second", step=1, time=1, value=ips
        )
        Experiment.objects.filter(pk=run.pk).update(status=Status.SUCCEEDED)
    phase_points_add(ddp, windows=2)
    study = alice_client.get(reverse("api-study", args=[body["id"]])).json()
    cell_single, cell_ddp = study["cells"]
    shares = run_shares(experiment_breakdown(experiment=ddp))
    assert cell_ddp["phase_shares"] == shares and cell_single["phase_shares"] is None
    sentence = efficiency_reason_text(efficiency=520 / 400 / 2, shares=shares)
    assert sentence is not None and sentence.startswith("efficiency 65%: ")
    assert cell_ddp["texts"]["efficiency_reason"] == sentence
    assert study["scaling"]["reasons"] == [
        {"cell": 0, "text": f"efficiency 100%: {NOT_MEASURED}"},
        {"cell": 1, "text": sentence},
    ]
    page = alice_client.get(reverse("study-detail", args=[body["id"]])).content.decode()
    assert sentence in page and shares_text(shares) in page


# --- exports ----------------------------------------------------------------------------------


def phase_keys(experiment: Experiment) -> set[str]:
    keys = SeriesPoint.objects.filter(experiment=experiment).values_list("key", flat=True)
    return {k for k in keys if re.match(r"^rank/\d+/(\w+_seconds|communication_bytes)$", k)}


@pytest.mark.django_db
def test_the_exports_carry_the_phase_series(alice_client: Client, tmp_path: Path) -> None:
    run = Experiment.objects.get(pk=phase_run_make(owner="alice", name="ddp", windows=2))
    expected = phase_keys(run)
    assert len(expected) == 2 * 7  # six phases and the bytes, two ranks

    def export(kind: str) -> bytes:
        response = alice_client.get(f"/api/experiments/{run.pk}/export/?format={kind}")
        return b"".join(response.streaming_content)

    rows = list(csv.DictReader(io.StringIO(export("csv").decode())))
    assert {r["key"] for r in rows} == expected
    assert [float(r["value"]) for r in rows if r["key"] == "rank/1/communication_bytes"] == [
        BYTES_PER_STEP * WINDOW_STEPS
    ] * 2
    assert set(json.loads(export("json"))["series"]) == expected
    with zipfile.ZipFile(io.BytesIO(export("tensorboard"))) as archive:
        archive.extractall(tmp_path)
        folder = tmp_path / archive.namelist()[0].split("/")[0]
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) == expected
    assert [e.step for e in accumulator.Scalars("rank/0/forward_seconds")] == [10, 20]
