"""A run's log by rank and level: the API's pages, filters and text download, who may read it,
and a real two-rank DDP run whose rank 1 lines are stored with their rank."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient, Client

from dashboard.experiments.models import Experiment, LogLine, Status
from dashboard.experiments.runs import runner
from dashboard.experiments.runs.runner import RunSupervisor
from dashboard.experiments.runs.sink import EventSink


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def log_lines(run: Experiment, rows: list[tuple[int, int | None, str, str]]) -> None:
    LogLine.objects.bulk_create(
        LogLine(experiment=run, seq=seq, time=seq / 10, rank=rank, level=level, message=message)
        for seq, rank, level, message in rows
    )


ROWS = [
    (1, None, "info", "note: one"),
    (1, None, "info", "note: two"),  # a started event's notes share its seq
    (2, 0, "warning", "Data: sample"),
    (3, 1, "warning", "Data: sample"),
    (4, 1, "info", "dataset tensors shared in rank 1"),
    (5, None, "stderr", "Traceback (most recent call last):"),
    (6, 1, "error", "rank 1 broke"),
    (7, None, "info", "training failed"),
]


@pytest.mark.django_db
def test_filters_by_rank_and_level(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice)
    log_lines(run, ROWS)
    client = logged_in(alice)

    def messages(query: str) -> list[tuple[int | None, str]]:
        body = client.get(f"/api/experiments/{run.pk}/logs/?{query}").json()
        assert body["ranks"] == [0, 1]
        return [(line["rank"], line["message"]) for line in body["lines"]]

    assert len(messages("")) == len(ROWS)
    assert messages("rank=1") == [
        (1, "Data: sample"),
        (1, "dataset tensors shared in rank 1"),
        (1, "rank 1 broke"),
    ]
    assert messages("rank=1&level=warning") == [(1, "Data: sample"), (1, "rank 1 broke")]
    # Plain stderr counts as a warning: a traceback is not hidden by "warnings and worse".
    assert messages("level=WARNING") == [
        (0, "Data: sample"),
        (1, "Data: sample"),
        (None, "Traceback (most recent call last):"),
        (1, "rank 1 broke"),
    ]
    assert messages("level=error") == [(1, "rank 1 broke")]
    bad_numbers = ("rank=-1", "rank=one", "after=x", "limit=0x", "rank=1234567", "after=+1")
    # Other scripts' digits: "²" passed str.isdigit() and then failed int() (a 500).
    unicode_digits = ("rank=\u00b2", "after=\u00b2", "limit=\u00b2", "rank=\u0663", "limit=1_0")
    for bad in (*bad_numbers, *unicode_digits, "level=loud"):
        assert client.get(f"/api/experiments/{run.pk}/logs/?{bad}").status_code == 400, bad


@pytest.mark.django_db
def test_pages_through_the_whole_log_without_splitting_a_seq(
    user_factory: Any, experiment_factory: Any
) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice)
    log_lines(run, ROWS)
    client = logged_in(alice)
    url: str | None = f"/api/experiments/{run.pk}/logs/?limit=1"
    pages: list[list[str]] = []
    while url:
        body = client.get(url).json()
        pages.append([line["message"] for line in body["lines"]])
        url = body["next"]
    assert pages[0] == ["note: one", "note: two"]  # one seq, one page, though limit is 1
    assert [m for page in pages for m in page] == [row[3] for row in ROWS]
    assert len(pages) == 7
    filtered = client.get(f"/api/experiments/{run.pk}/logs/?rank=1&limit=2").json()
    assert "rank=1" in filtered["next"] and "after=4" in filtered["next"]


@pytest.mark.django_db
def test_downloads_as_text(user_factory: Any, experiment_factory: Any) -> None:
    alice = user_factory()
    run = experiment_factory(owner=alice, name="ddp run")
    log_lines(run, ROWS)
    response = logged_in(alice).get(f"/api/experiments/{run.pk}/logs/?format=text&rank=1")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert f'filename="run-{run.pk}-log.txt"' in response["Content-Disposition"]
    text = b"".join(response.streaming_content).decode().splitlines()
    assert text[0].startswith(f"# run #{run.pk} ddp run")
    assert text[1:] == [
        "       0.3s rank  1 WARNING | Data: sample",
        "       0.4s rank  1 INFO    | dataset tensors shared in rank 1",
        "       0.6s rank  1 ERROR   | rank 1 broke",
    ]


@pytest.mark.django_db(transaction=True)
async def test_under_asgi_the_text_is_sent_a_chunk_at_a_time(
    user_factory: Any, experiment_factory: Any
) -> None:
    """Daphne serves through Django's ASGI handler, which reads a synchronous iterator whole
    into memory (and warns): the download hands it an asynchronous one."""
    alice = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(owner=alice, name="ddp run")
    await sync_to_async(log_lines)(run, ROWS)
    client = AsyncClient()
    await client.aforce_login(alice)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        response = await client.get(f"/api/experiments/{run.pk}/logs/?format=text")
        assert response.status_code == 200 and response.is_async
        chunks = [chunk async for chunk in response.streaming_content]
    assert len(chunks) == 1 + len(ROWS)


@pytest.mark.django_db
def test_another_users_log_is_never_shown(user_factory: Any, experiment_factory: Any) -> None:
    alice, bob, staff = user_factory(), user_factory(), user_factory(staff=True)
    run = experiment_factory(owner=alice)
    log_lines(run, ROWS)
    for query in ("", "?rank=1", "?format=text"):
        response = logged_in(bob).get(f"/api/experiments/{run.pk}/logs/{query}")
        assert response.status_code == 404 and b"rank 1 broke" not in response.content
    assert Client().get(f"/api/experiments/{run.pk}/logs/").status_code == 401
    assert logged_in(staff).get(f"/api/experiments/{run.pk}/logs/?rank=1").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_real_ddp_runs_rank_1_lines_are_stored_and_filtered(
    user_factory: Any,
    experiment_factory: Any,
    sample_data: Path,
    tmp_path: Path,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.TRAINYARD_DATA_DIR = str(sample_data)
    settings.TRAINYARD_RUNS_DIR = str(tmp_path)
    environment = runner.training_environment

    def with_info_lines(*, experiment: Experiment) -> dict[str, str]:
        # The dashboard's own levels (rank 0 warnings and worse, its info lines being events;
        # the other ranks' info: each says which dataset tensors it shares), and c10d's info
        # lines, which every rank writes from C++ without a Trainyard marker.
        return {**environment(experiment=experiment), "TORCH_CPP_LOG_LEVEL": "INFO"}

    def short(*, experiment: Experiment) -> list[str]:
        return [*command(experiment=experiment), "--steps-per-epoch", "4"]

    command = runner.training_command
    monkeypatch.setattr(runner, "training_environment", with_info_lines)
    monkeypatch.setattr(runner, "training_command", short)
    alice = user_factory()
    run = experiment_factory(
        owner=alice, strategy="ddp", processes=2, status=Status.RUNNING, attempt=1
    )
    outcome = RunSupervisor(experiment=run, sink=EventSink(run)).run()
    assert outcome is not None and outcome.status == Status.SUCCEEDED, outcome
    rank1 = LogLine.objects.filter(experiment=run, rank=1)
    assert rank1.filter(message__startswith="dataset tensors shared in rank 1").exists()
    assert not rank1.filter(message__contains="[trainyard]").exists()  # the message alone
    body = logged_in(alice).get(f"/api/experiments/{run.pk}/logs/?rank=1&level=info").json()
    assert body["ranks"] == [0, 1]
    assert body["lines"] and {line["rank"] for line in body["lines"]} == {1}
    assert any("shared in rank 1" in line["message"] for line in body["lines"])
    # Every rank's own unmarked lines (issue 34 item 7: DDP's reducer says its buckets on each
    # rank) kept with their rank, without torchrun's prefix; torchrun's own (its store's c10d
    # lines) with none.
    reducer = LogLine.objects.filter(experiment=run, level="stderr", message__contains="Reducer")
    assert set(reducer.values_list("rank", flat=True)) == {0, 1}
    assert not LogLine.objects.filter(experiment=run, message__startswith="[rank").exists()
