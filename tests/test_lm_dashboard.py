"""byte-llama on the dashboard (issue 36, the dashboard's side): a language model's size, window
and sequence parallel through the API and the launch form, judged against the engine's facts
(training/text_catalogue.py, training.refusals' language_refusals) with the engine's reasons;
the runner's flags; the sink's tokens/s, MFU, bits per byte and texts from a language model's
recorded events (as `python -m training --model byte-llama` wrote them here), read back in the
read JSON; the run page's figures and text, the compare and study pages' columns.

Machines are WorkerMachine rows with the report a worker that has the Jargon File and a text
folder writes (training.catalogue.catalogue_collect's keys); the engine's own run through the
stack is tests/test_models_stack.py's."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Experiment, SeriesPoint
from dashboard.experiments.runs.runner import training_command
from dashboard.experiments.runs.sink import EventSink
from tests.factories import api_post, form_data
from training.text_catalogue import BYTE_LLAMA_SIZES

pytestmark = pytest.mark.django_db

TEXTS = "/data/textfolders/poems"
LM = {"model": "byte-llama", "dataset": "jargon"}


def lm_report() -> dict[str, Any]:
    """A worker's report with the built-ins, the Jargon File and a text folder."""
    models = ("simple-cnn", "byte-llama")
    datasets = ("mnist", "fashion-mnist", "jargon", "textfolder")
    return {
        "cpu_count": 4,
        "gpus": [],
        "models": list(models),
        "model_sources": dict.fromkeys(models, "built in"),
        "models_splittable": list(models),
        "models_tensor_parallel": list(models),
        "datasets": list(datasets),
        "dataset_details": [
            {"name": d, "where": f"/data/{d}", "bytes": 1024, "source": f"{d} files"}
            for d in datasets
        ],
        "image_folders": [],
        "language_models": ["byte-llama"],
        "text_folders": [{"path": TEXTS, "files": 2, "bytes": 5000, "layout": "one folder"}],
    }


@pytest.fixture(autouse=True)
def many_launches(settings: Any) -> None:
    """A test here launches more runs a minute than a person would; limits have their tests."""
    settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE = 0
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 0


@pytest.fixture
def worker() -> WorkerMachine:
    return WorkerMachine.objects.create(
        hostname="host-a", report=lm_report(), reported_at=timezone.now()
    )


@pytest.fixture
def client(alice_client: Client, worker: WorkerMachine) -> Client:
    return alice_client


def launch(client: Client, **fields: Any) -> dict[str, Any]:
    response = api_post(client, {"strategy": "ddp", "processes": 2, **LM, **fields})
    assert response.status_code == 201, response.content
    return dict(response.json())


# --- launch, read back, the training command ---------------------------------------------------


def test_a_byte_llama_run_round_trips_its_size_and_window(client: Client, launched: Any) -> None:
    run = launch(client, model_size="smoke", seq_len=64)
    again = client.get(reverse("api-experiment", args=[run["id"]])).json()
    for body in (run, again):
        assert (body["model"], body["model_size"], body["seq_len"]) == ("byte-llama", "smoke", 64)
        assert (body["dataset"], body["sequence_parallel"]) == ("jargon", None)  # ddp: not read
        # No evaluation yet: the figures are null, no text.
        assert [body[k] for k in ("tokens_per_second", "mfu", "bits_per_byte")] == [None] * 3
        assert body["samples"] == []
    # Blank: the size's defaults, stored as the run trains with them.
    default = launch(client)
    small = BYTE_LLAMA_SIZES["small"]
    assert (default["model_size"], default["seq_len"]) == ("small", small.seq_len)
    # Tensor parallel reads sequence parallel: on unless asked off.
    tp = launch(client, strategy="tensor-parallel", model_size="smoke")
    off = launch(client, strategy="tensor-parallel", model_size="smoke", sequence_parallel=False)
    assert (tp["sequence_parallel"], off["sequence_parallel"]) == (True, False)
    # A classifier's run says null for all three.
    cnn = api_post(client, {"strategy": "single"}).json()
    assert [cnn[k] for k in ("model_size", "seq_len", "sequence_parallel")] == [None] * 3


def test_the_runner_passes_the_language_flags(client: Client, launched: Any) -> None:
    def command(**fields: Any) -> list[str]:
        return training_command(
            experiment=Experiment.objects.get(pk=launch(client, **fields)["id"])
        )

    ddp = command(model_size="smoke", seq_len=64)
    assert ddp[ddp.index("--model") + 1] == "byte-llama" and "--sequence-parallel" not in ddp
    assert ddp[ddp.index("--model-size") + 1 :][:3] == ["smoke", "--seq-len", "64"]
    tp = command(strategy="tensor-parallel", model_size="smoke", sequence_parallel=False)
    assert "--no-sequence-parallel" in tp
    folder = command(dataset="textfolder", data_path=TEXTS, model_size="smoke")
    assert folder[folder.index("--data-path") + 1] == TEXTS
    cnn = training_command(experiment=Experiment.objects.get(pk=api_post(
        client, {"strategy": "single"}).json()["id"]))  # fmt: skip
    assert "--model-size" not in cnn and "--seq-len" not in cnn


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**LM, "dataset": "mnist"}, "dataset", "is a language model: it trains on text"),
        ({"model": "simple-cnn", "dataset": "jargon"}, "model", "jargon is text"),
        ({**LM, "model_size": "huge"}, "model_size", "huge is not a size of byte-llama"),
        ({**LM, "seq_len": 4}, "seq_len", "greater than or equal to 8"),
        ({**LM, "seq_len": 100_000}, "seq_len", "less than or equal to 65536"),
        # smoke: 4 heads, 2 layers.
        ({**LM, "model_size": "smoke", "strategy": "tensor-parallel", "processes": 3},
         "processes", "its number of heads, 4, is not a multiple of 3"),
        ({**LM, "model_size": "smoke", "strategy": "pipeline", "processes": 3, "microbatches": 3},
         "processes", "it has 2 layers"),
        ({**LM, "model_size": "smoke", "strategy": "tensor-parallel", "seq_len": 33},
         "seq_len", "window (--seq-len), 33, is not a multiple of 2"),
        # Interleaved 1F1B's rounds (max(1, 5 // 2) = 2) must divide the micro-batches.
        ({**LM, "strategy": "pipeline", "pipeline_schedule": "interleaved-1f1b",
          "microbatches": 5, "batch_size": 10},
         "microbatches", "5 micro-batches make 2 rounds over 2 processes"),
        ({**LM, "strategy": "hogwild"}, "strategy", "does not train language models"),
        ({"seq_len": 64}, "seq_len", "only a language model reads it (byte-llama), not simple-cnn"),
        ({**LM, "sequence_parallel": False}, "sequence_parallel", "applies to tensor parallel"),
        ({**LM, "dataset": "textfolder"}, "data_path", "textfolder needs data_path"),
        ({**LM, "dataset": "textfolder", "data_path": "/elsewhere"}, "data_path",
         f"no online worker reports a text folder at /elsewhere; the workers have host-a: {TEXTS}"),
    ],
)  # fmt: skip
def test_what_the_engine_refuses_is_refused_at_launch(
    client: Client, launched: Any, body: dict[str, Any], field: str, words: str
) -> None:
    response = api_post(client, {"strategy": "ddp", "processes": 2, **body})
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["errors"][field])
    assert launched == []


# --- the sink, from a language model's recorded events ----------------------------------------

# As `python -m training --model byte-llama --model-size smoke --dataset jargon --strategy ddp
# --nproc 2 --steps-per-epoch 4` wrote them here (the figures kept, the rest trimmed); the
# model's text has a NUL, which it may write and PostgreSQL refuses in any text.
PEAK = 322774318617.61426
FLOPS_PER_TOKEN = 234432
STARTED = {
    "type": "started", "time": 1.55, "strategy": "ddp", "world_size": 2, "global_batch_size": 8,
    "model": "byte-llama", "total_steps": 4, "peak_flops": PEAK,
    "peak_source": "measured peak (2 cores, fp32 matmul 1024x1024)",
    "model_info": {"name": "byte-llama", "parameters": 43168, "model_size": "smoke",
                   "seq_len": 32, "flops_per_token": FLOPS_PER_TOKEN},
}  # fmt: skip


def step(number: int, ips: float, tokens: float, mfu: float) -> dict[str, Any]:
    ranks = [
        {
            "rank": r,
            "images_per_second": ips / 2,
            "tokens_per_second": tokens / 2,
            "data_seconds": 0.0002,
            "compute_seconds": 0.04,
            "rss_bytes": 7e8,
        }
        for r in (0, 1)
    ]
    return {"type": "step", "time": 1.6 + number / 10, "epoch": 1, "step": number, "lr": 1e-3,
            "train_loss": 5.9, "images_per_second": ips, "tokens_per_second": tokens,
            "mfu": mfu, "grad_norm": 0.6, "ranks": ranks}  # fmt: skip


EPOCH = {
    "type": "epoch", "time": 3.15, "epoch": 1, "step": 4, "test_loss": 5.934255,
    "test_accuracy": 0.00289, "images_per_second": 238.3, "tokens_per_second": 7625.6,
    "mfu": 0.00554, "grad_norm": 0.656407, "bits_per_byte": 8.56132, "perplexity": 377.758461,
    "sample": "kZj\n<b>hacker</b>\x00 ok",
}  # fmt: skip


def lm_run(owner: Any, experiment_factory: Any) -> Experiment:
    run = experiment_factory(owner=owner, status="running", **LM, model_size="smoke", seq_len=32)
    sink = EventSink(run)
    sink.add(STARTED)
    sink.add(step(1, 190.0, 6080.0, 0.00442))
    sink.add(step(4, 323.3, 10345.6, 0.00751))
    sink.add(EPOCH)
    sink.flush()
    run.refresh_from_db()
    return run


def test_the_sink_stores_a_language_models_figures(
    alice: Any, alice_client: Client, experiment_factory: Any
) -> None:
    run = lm_run(alice, experiment_factory)
    keys = set(SeriesPoint.objects.filter(experiment=run).values_list("key", flat=True))
    assert {
        "tokens_per_second", "mfu", "grad_norm", "rank/0/tokens_per_second",
        "rank/1/tokens_per_second", "bits_per_byte", "perplexity", "epoch/tokens_per_second",
        "epoch/mfu",
    } <= keys  # fmt: skip
    # The row keeps the evaluation's, as test loss; the text storable, the NUL replaced.
    assert (run.bits_per_byte, run.mfu) == (8.56132, 0.00554)
    assert run.samples == [{"epoch": 1, "step": 4, "text": "kZj\n<b>hacker</b>\ufffd ok"}]
    body = alice_client.get(reverse("api-experiment", args=[run.pk])).json()
    # Tokens/s: images/s's definition over the step windows (1 step, then 3).
    tokens = 4 / (1 / 6080.0 + 3 / 10345.6)
    assert body["tokens_per_second"] == pytest.approx(tokens)
    assert body["mfu"] == pytest.approx(tokens * FLOPS_PER_TOKEN / PEAK)
    assert body["bits_per_byte"] == 8.56132 and body["samples"] == run.samples
    assert body["peak_source"].startswith("measured peak")
    assert (body["model_size"], body["seq_len"]) == ("smoke", 32)


def test_the_list_reads_every_language_models_figures_at_once(
    alice: Any, alice_client: Client, experiment_factory: Any
) -> None:
    """The list of runs leaves the series out (a page of many runs): a language model's
    tokens/s comes for the whole page in one read of the tokens series, not each run's whole
    series (every rank's images/s too) one run at a time."""
    first = lm_run(alice, experiment_factory)

    def listed() -> tuple[dict[str, Any], int]:
        with CaptureQueriesContext(connection) as queries:
            response = alice_client.get(reverse("api-experiments"))
        assert response.status_code == 200
        return response.json(), len(queries)

    _, one = listed()
    for _ in range(3):
        lm_run(alice, experiment_factory)
    body, four = listed()
    assert four == one
    [row] = [r for r in body["experiments"] if r["id"] == first.pk]
    read = alice_client.get(reverse("api-experiment", args=[first.pk])).json()
    figures = ("tokens_per_second", "mfu", "bits_per_byte", "peak_source", "samples")
    assert {k: row[k] for k in figures} == {k: read[k] for k in figures}
    assert row["tokens_per_second"] == pytest.approx(4 / (1 / 6080.0 + 3 / 10345.6))


def test_a_classifiers_steps_store_no_tokens(alice: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=alice, status="running")
    sink = EventSink(run)
    ranks = [{"rank": 0, "images_per_second": 50.0}]
    message = sink.add({"type": "step", "time": 1.0, "epoch": 1, "step": 5, "train_loss": 1.0,
                        "images_per_second": 100.0, "ranks": ranks})  # fmt: skip
    sink.flush()
    assert "language" not in message
    keys = set(SeriesPoint.objects.filter(experiment=run).values_list("key", flat=True))
    assert not {key for key in keys if "tokens" in key or "mfu" in key}


def test_live_messages_carry_the_figures_so_far(alice: Any, experiment_factory: Any) -> None:
    run = experiment_factory(owner=alice, status="running", **LM, model_size="smoke", seq_len=32)
    sink = EventSink(run)
    sink.add(STARTED)
    stepped = sink.add(step(4, 323.3, 10345.6, 0.00751))
    evaluated = sink.add(EPOCH)
    language = stepped["language"]  # type: ignore[typeddict-item]
    assert language["tokens_per_second"] == pytest.approx(10345.6)
    assert language["texts"]["mfu_note"] == "measured peak" and language["sample"] is None
    assert language["texts"]["tokens_per_second"] == "10,346 tokens/s"
    after = evaluated["language"]  # type: ignore[typeddict-item]
    assert after["sample"]["text"].startswith("kZj") and after["texts"]["bits_per_byte"] == "8.561"
    assert after["texts"]["sample_when"] == "Written at epoch 1 (step 4)."


# --- the pages ------------------------------------------------------------------------------------


def test_the_launch_form_shows_the_language_fields(client: Client, launched: Any) -> None:
    page = client.get(reverse("experiment-new")).content.decode()
    assert 'id="language-fields"' in page and 'name="seq_len"' in page
    assert '<option value="smoke">smoke</option>' in page and "default (small)" in page
    assert '<optgroup label="Text folders">' in page and f'<option value="{TEXTS}">' in page
    options = json.loads(page.split('id="launch-options" type="application/json">')[1]
                         .split("</script>")[0])  # fmt: skip
    assert options["language"]["language_models"] == ["byte-llama"]
    assert options["language"]["sizes"]["smoke"]["help"] == BYTE_LLAMA_SIZES["smoke"].help
    # Posted from the page: launched with the size's window; a classifier drops the hidden ones.
    post = form_data(model="byte-llama", dataset="jargon", strategy="ddp", model_size="smoke",
                     seq_len="", sequence_parallel="")  # fmt: skip
    response = client.post(reverse("experiment-new"), post)
    assert response.status_code == 302, response.content.decode()[-2000:]
    run = Experiment.objects.latest("pk")
    assert (run.model_size, run.seq_len, run.sequence_parallel) == ("smoke", 32, None)
    post = form_data(model="simple-cnn", model_size="smoke", seq_len="64")
    assert client.post(reverse("experiment-new"), post).status_code == 302
    run = Experiment.objects.latest("pk")
    assert (run.model_size, run.seq_len) == ("", None)


def test_the_run_page_shows_the_figures_and_the_text_as_text(
    alice: Any, alice_client: Client, experiment_factory: Any
) -> None:
    run = lm_run(alice, experiment_factory)
    page = alice_client.get(run.get_absolute_url()).content.decode()
    assert 'id="stat-tps"' in page and "tokens/s" in page and 'id="stat-bpb">8.561<' in page
    assert 'id="stat-mfu-note"' in page and ">measured peak<" in page
    # The model's bytes are text, escaped in a <pre>: never markup.
    assert "&lt;b&gt;hacker&lt;/b&gt;" in page and "<b>hacker</b>" not in page.split("json")[0]
    assert "Written at epoch 1 (step 4)." in page
    snapshot = json.loads(page.split('id="experiment-snapshot" type="application/json">')[1]
                          .split("</script>")[0])  # fmt: skip
    assert snapshot["language"]["sample"]["text"] == run.samples[-1]["text"]
    # A classifier's page has none of it.
    cnn = experiment_factory(owner=alice)
    assert 'id="stat-tps"' not in alice_client.get(cnn.get_absolute_url()).content.decode()


def test_compare_and_studies_show_the_language_figures(
    alice: Any, alice_client: Client, experiment_factory: Any, worker: Any, launched: Any
) -> None:
    run, cnn = lm_run(alice, experiment_factory), experiment_factory(owner=alice)
    url = reverse("experiment-compare") + f"?ids={run.pk},{cnn.pk}"
    page = alice_client.get(url).content.decode()
    assert 'data-field="tokens_per_second">' in page and 'data-field="bits_per_byte">8.561<' in page
    only_cnn = alice_client.get(reverse("experiment-compare") + f"?ids={cnn.pk}").content.decode()
    assert 'data-field="tokens_per_second"' not in only_cnn
    rows = alice_client.get(reverse("api-experiments-compare") + f"?ids={run.pk}").json()["runs"]
    assert rows[0]["bits_per_byte"] == 8.56132 and math.isfinite(rows[0]["tokens_per_second"])
    # A study sweeps a language model's window; a classifier's cells of it are skipped.
    study = {
        "name": "windows", "base": {"dataset": "jargon", "model_size": "smoke", "epochs": 1},
        "axes": {"model": ["byte-llama", "simple-cnn"], "seq_len": [32, 64]},
        "target_accuracy": 0.5,
    }  # fmt: skip
    response = alice_client.post(reverse("api-studies"), json.dumps(study),
                                 content_type="application/json")  # fmt: skip
    assert response.status_code == 201, response.content
    body = alice_client.get(reverse("api-study", args=[response.json()["id"]])).json()
    assert sorted(c["config"]["seq_len"] for c in body["cells"]) == [32, 64]
    assert [c["values"]["model"] for c in body["skipped"]] == ["simple-cnn", "simple-cnn"]
    assert all(c["language"] and c["texts"]["tokens_per_second"] == "—" for c in body["cells"])
