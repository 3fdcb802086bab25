"""Memory per rank on the pages (issue 18): the epoch event's ``memory`` (protocol 1.7) stored as
series by the sink, shown on the run page (server-rendered and in the snapshot and the epoch
message the socket sends), the compare page and the study table; FSDP's ranks hold half the
model's parameters each, DDP's the whole."""

from __future__ import annotations

import csv
import io
import json
import re
from html import unescape
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse

from dashboard.experiments.metrics.series_contract import CHARTS, MEMORY_FIELDS
from dashboard.experiments.models import Experiment, SeriesPoint, Status
from dashboard.experiments.runs.sink import EventSink
from tests.test_consumers import communicator
from tests.test_studies import TWO_BY_TWO, post
from training.protocol import MemoryEntry

pytestmark = pytest.mark.django_db

PARAMETERS = 1024  # the started event's count: one whole copy is 4 KiB in float32
RUN_INFO = {"model_info": {"parameters": PARAMETERS}}
MiB = 1024**2


def entry(rank: int, *, params: int, peak_mib: int) -> dict[str, int]:
    """What a rank reports: Adam's two moments (and its step counter) beside the gradients."""
    return {
        "rank": rank, "parameter_bytes": params, "gradient_bytes": params,
        "optimizer_state_bytes": 2 * params + 4, "peak_bytes": peak_mib * MiB,
    }  # fmt: skip


# DDP: every rank holds the whole model; FSDP x2: each holds half of it.
DDP = [entry(0, params=4096, peak_mib=300), entry(1, params=4096, peak_mib=310)]
FSDP = [entry(0, params=2048, peak_mib=250), entry(1, params=2048, peak_mib=240)]


def memory_run(owner: Any, memory: list[dict[str, int]], **fields: Any) -> Experiment:
    values = {"name": "run", "strategy": "ddp", "processes": 2, "status": Status.SUCCEEDED,
              "run_info": RUN_INFO, "memory": memory, **fields}  # fmt: skip
    return Experiment.objects.create(owner=owner, **values)


def embedded(html: str, element_id: str) -> Any:
    marker = f'id="{element_id}" type="application/json">'
    start = html.index(marker) + len(marker)
    return json.loads(html[start : html.index("</script>", start)])


def memory_table(html: str) -> str:
    start = html.index('id="memory-table"')
    return html[start : html.index("</table>", start)]


def test_the_series_contract_declares_every_field_of_a_memory_entry() -> None:
    assert {"rank", *MEMORY_FIELDS} == set(MemoryEntry.__required_keys__)
    charted = {
        field for field in MEMORY_FIELDS for chart in CHARTS
        if re.search(chart["match"], f"rank/3/{field}")
    }  # fmt: skip
    assert charted == set(MEMORY_FIELDS)


def test_the_sink_stores_an_epochs_memory_as_series_and_sends_its_rows(
    user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory(), status="running")
    sink = EventSink(run)
    sink.add({"type": "started", "strategy": "fsdp", "model_info": RUN_INFO["model_info"]})
    malformed = {**FSDP[1], "rank": 7, "peak_bytes": "lots"}
    epoch = sink.add({"type": "epoch", "epoch": 1, "step": 63, "time": 9.0, "test_accuracy": 0.9,
                      "memory": [*FSDP, malformed]})  # fmt: skip
    sink.flush()
    points = {
        p.key: (p.step, p.value)
        for p in SeriesPoint.objects.filter(experiment=run, key__startswith="rank/")
    }
    assert points == {
        f"rank/{e['rank']}/{field}": (63, float(e[field])) for e in FSDP for field in MEMORY_FIELDS
    }
    run.refresh_from_db()
    assert run.memory == FSDP  # the read JSON's, without the malformed entry
    message: dict[str, Any] = dict(epoch)
    assert message["memory"] == FSDP  # the page charts what the row keeps
    rows = message["texts"]["memory"]
    assert [(r["rank"], r["share_text"], r["held_bytes"]) for r in rows] == [
        (0, "50%", 2048 * 4 + 4), (1, "50%", 2048 * 4 + 4),
    ]  # fmt: skip
    assert rows[0]["parameters_text"] == "2.0 KiB" and rows[1]["peak_text"] == "240.0 MiB"


def test_the_read_json_metrics_and_export_carry_the_memory(
    alice: Any, alice_client: Client
) -> None:
    run = memory_run(alice, DDP)
    sink = EventSink(run)
    sink.add({"type": "epoch", "epoch": 1, "step": 30, "time": 5.0, "memory": DDP})
    sink.flush()
    detail = alice_client.get(reverse("api-experiment", args=[run.pk])).json()
    assert detail["memory"] == DDP
    metrics = alice_client.get(reverse("api-experiment-metrics", args=[run.pk])).json()
    # A bucket's last value is its index 7.
    assert metrics["series"]["rank/1/peak_bytes"]["buckets"][0][7] == 310 * MiB
    export = alice_client.get(reverse("api-experiment-export", args=[run.pk]) + "?format=csv")
    text = b"".join(export.streaming_content).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {"rank/0/optimizer_state_bytes", "rank/1/gradient_bytes"} <= {r["key"] for r in rows}


def test_the_run_page_shows_each_ranks_memory_and_share(alice: Any, alice_client: Client) -> None:
    run = memory_run(alice, FSDP, strategy="fsdp")
    html = alice_client.get(reverse("experiment-detail", args=[run.pk])).content.decode()
    table = memory_table(html)
    assert 'id="memory-table" hidden' not in html
    assert table.count("<tr data-rank=") == 2
    assert "2.0 KiB" in table and "50%" in table and "8.0 KiB" in table and "250.0 MiB" in table
    assert 'style="width: 50.0%"' in table  # the share's bar
    # The snapshot the page starts from (and the socket's first message) carries the same rows.
    snapshot = embedded(html, "experiment-snapshot")
    assert snapshot["experiment"]["memory"] == FSDP
    assert [r["share_text"] for r in snapshot["texts"]["memory"]] == ["50%", "50%"]
    # DDP's ranks each hold the whole model.
    ddp = memory_run(alice, DDP)
    html = alice_client.get(reverse("experiment-detail", args=[ddp.pk])).content.decode()
    assert memory_table(html).count('<span class="num">100%</span>') == 2


def test_a_run_without_memory_says_so(alice: Any, alice_client: Client) -> None:
    run = memory_run(alice, [], status=Status.RUNNING)
    html = alice_client.get(reverse("experiment-detail", args=[run.pk])).content.decode()
    assert 'id="memory-table" hidden' in html
    assert 'id="memory-empty" hidden' not in html
    assert embedded(html, "experiment-snapshot")["texts"]["memory"] == []


def test_without_a_parameter_count_the_share_is_unknown(alice: Any, alice_client: Client) -> None:
    run = memory_run(alice, DDP, run_info={})  # a run from before protocol 1.6
    html = alice_client.get(reverse("experiment-detail", args=[run.pk])).content.decode()
    table = memory_table(html)
    assert "%" not in table and table.count("<tr data-rank=") == 2


def test_the_compare_page_shows_memory_beside_accuracy(alice: Any, alice_client: Client) -> None:
    ddp = memory_run(alice, DDP, name="ddp run")
    fsdp = memory_run(alice, FSDP, name="fsdp run", strategy="fsdp")
    bare = memory_run(alice, [], name="no memory")
    ids = f"?ids={ddp.pk},{fsdp.pk},{bare.pk}"
    html = alice_client.get(reverse("experiment-compare") + ids).content.decode()
    cells = re.findall(
        r'<td class="memory-cell" data-field="memory">(.*?)</td>', unescape(html), re.S
    )
    assert len(cells) == 3
    # DDP's largest rank holds 4 + 4 + 8 KiB (and the 4 bytes of Adam's step), all the model.
    assert "16.0 KiB held by rank 0" in cells[0] and "100% of the model" in cells[0]
    assert "peak 310.0 MiB" in cells[0] and cells[0].count("<li data-rank=") == 2
    assert "8.0 KiB held by rank 0" in cells[1] and "50% of the model" in cells[1]
    assert "rank 1: 8.0 KiB held · 50% · peak 240.0 MiB" in cells[1]
    assert cells[2].strip().startswith('<span data-text="memory_held">—</span>')
    rows = alice_client.get(reverse("api-experiments-compare") + ids).json()["runs"]
    assert [r["memory_held_bytes"] for r in rows] == [4 * 4096 + 4, 4 * 2048 + 4, None]
    assert [r["memory_peak_bytes"] for r in rows] == [310 * MiB, 250 * MiB, None]
    assert rows[1]["memory"] == FSDP


def test_the_study_table_shows_each_cells_memory(alice_client: Client, launched: Any) -> None:
    axes = {"strategy": ["ddp", "fsdp"], "seed": [1, 2]}
    body = post(alice_client, {**TWO_BY_TWO, "axes": axes}).json()
    ddp1, ddp2, fsdp1, fsdp2 = (Experiment.objects.get(pk=pk) for pk in body["runs"])
    # The cell takes its runs' largest rank and highest peak, whichever seed.
    for run, memory in ((ddp1, DDP[:1]), (ddp2, DDP), (fsdp1, FSDP), (fsdp2, [])):
        Experiment.objects.filter(pk=run.pk).update(memory=memory, run_info=RUN_INFO)
    ddp, fsdp = alice_client.get(reverse("api-study", args=[body["id"]])).json()["cells"]
    assert (ddp["memory_held_bytes"], ddp["memory_peak_bytes"]) == (4 * 4096 + 4, 310 * MiB)
    assert (fsdp["memory_share"], fsdp["memory_peak_bytes"]) == (0.5, 250 * MiB)
    assert fsdp["texts"]["memory_held"] == "8.0 KiB held by rank 0"
    assert fsdp["texts"]["memory_share"] == "50% of the model's parameters"
    page = alice_client.get(reverse("study-detail", args=[body["id"]])).content.decode()
    assert "16.0 KiB held by rank 0" in page and "peak 250.0 MiB" in page
    export = alice_client.get(reverse("api-study-export", args=[body["id"]]))
    rows = list(csv.DictReader(io.StringIO(export.content.decode())))
    assert [int(r["memory_held_bytes"]) for r in rows] == [4 * 4096 + 4, 4 * 2048 + 4]


@pytest.mark.django_db(transaction=True)
async def test_an_epochs_memory_reaches_the_open_page(
    user_factory: Any, experiment_factory: Any
) -> None:
    owner = await sync_to_async(user_factory)()
    run = await sync_to_async(experiment_factory)(
        owner=owner, status="running", run_info=RUN_INFO, memory=DDP
    )
    comm = communicator(run.pk, owner)
    connected, _ = await comm.connect()
    assert connected
    snapshot = await comm.receive_json_from()
    assert [r["share_text"] for r in snapshot["texts"]["memory"]] == ["100%", "100%"]
    sink = await sync_to_async(EventSink)(run)
    sink.add({"type": "epoch", "epoch": 2, "step": 60, "time": 9.0, "memory": FSDP})
    await sync_to_async(sink.flush)()
    message = await comm.receive_json_from()
    assert message["type"] == "epoch" and message["memory"] == FSDP
    assert [r["held_text"] for r in message["texts"]["memory"]] == ["8.0 KiB", "8.0 KiB"]
    await comm.disconnect()
