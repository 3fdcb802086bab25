"""A plug-in's language model launched from the dashboard (issue 36, item 1): the web server has
no plug-in installed, so it knows one as a language model from its workers' reports
(``language_models``, training.catalogue.catalogue_collect's key) and hands that to the engine's
refusals (training.refusals.language_refusals): a worker that reports it lets it launch on text,
stored and read back as a language-model run, with the engine's refusals of byte-llama's size,
sequence parallel and a pipeline with no declared parts; no worker that reports it, and text
refuses it as a classifier. The engine's side is tests/test_lm_plugin.py's."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.runner import training_command
from dashboard.experiments.runs.sink import EventSink
from tests.factories import api_post
from tests.test_lm_dashboard import EPOCH, STARTED, lm_report, many_launches, step

pytestmark = pytest.mark.django_db
__all__ = ["many_launches"]  # the autouse fixture, imported to apply here

PLUGIN = "tiny-lm"
BODY = {"model": PLUGIN, "dataset": "jargon", "strategy": "ddp", "processes": 2}


def worker_with(*, language: bool, splittable: bool = False) -> WorkerMachine:
    """host-a with the plug-in installed: as a language model where ``language`` (its build
    declares ``language = True``), else as the worker of an older engine reports any plug-in."""
    report = lm_report()
    report["models"].append(PLUGIN)
    report["model_sources"][PLUGIN] = "plug-in tiny-lm"
    report["models_splittable"] += [PLUGIN] if splittable else []
    report["language_models"] += [PLUGIN] if language else []
    return WorkerMachine.objects.create(
        hostname="host-a", report=report, reported_at=timezone.now()
    )


def test_a_reported_plugin_language_model_launches_as_one(
    alice_client: Client, launched: list[int]
) -> None:
    worker_with(language=True)
    response = api_post(alice_client, {**BODY, "seq_len": 48})
    assert response.status_code == 201, response.content
    run = Experiment.objects.get(pk=response.json()["id"])
    # Its window as given; byte-llama's size and sequence parallel are not its.
    assert (run.model, run.dataset, run.model_size, run.seq_len) == (PLUGIN, "jargon", "", 48)
    assert run.sequence_parallel is None
    command = training_command(experiment=run)
    assert command[command.index("--seq-len") + 1] == "48"
    assert "--model-size" not in command and "--sequence-parallel" not in command
    # A language model's figures, as byte-llama's: tokens/s, bits per byte, the text it writes.
    sink = EventSink(run)
    for event in ({**STARTED, "model": PLUGIN}, step(1, 190.0, 6080.0, 0.004), EPOCH):
        sink.add(event)
    sink.flush()
    body = alice_client.get(reverse("api-experiment", args=[run.pk])).json()
    assert body["tokens_per_second"] and body["tokens_per_second"] > 0
    assert body["bits_per_byte"] == EPOCH["bits_per_byte"]
    assert [s["text"] for s in body["samples"]] == ["kZj\n<b>hacker</b>\ufffd ok"]
    assert (body["model_size"], body["seq_len"], body["sequence_parallel"]) == (None, 48, None)
    page = alice_client.get(reverse("experiment-detail", args=[run.pk])).content.decode()
    assert 'id="stat-bpb"' in page and 'id="lm-sample"' in page
    # The form offers it as a language model, without byte-llama's sizes.
    facts = alice_client.get(reverse("experiment-new")).context["launch_options"]["language"]
    assert PLUGIN in facts["language_models"] and PLUGIN not in facts["sized"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"model_size": "smoke"}, "model_size",
         "byte-llama's only; the plug-in language model tiny-lm has its own size"),
        ({"strategy": "tensor-parallel", "sequence_parallel": False}, "sequence_parallel",
         "byte-llama's only; the plug-in language model tiny-lm has its own size"),
        ({"strategy": "pipeline", "microbatches": 2}, "strategy",
         "the plug-in language model tiny-lm declares no cut (build.stages(model)"),
    ],
)  # fmt: skip
def test_the_engines_refusals_of_a_plugin_language_model(
    alice_client: Client, launched: list[int], body: dict[str, Any], field: str, words: str
) -> None:
    worker_with(language=True)
    response = api_post(alice_client, {**BODY, **body})
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["errors"][field])
    assert launched == []


def test_a_plugin_pipeline_with_declared_parts_launches(
    alice_client: Client, launched: list[int]
) -> None:
    worker_with(language=True, splittable=True)
    response = api_post(alice_client, {**BODY, "strategy": "pipeline", "microbatches": 2})
    assert response.status_code == 201, response.content


def test_a_plugin_no_worker_reports_as_a_language_model_is_refused_on_text(
    alice_client: Client, launched: list[int]
) -> None:
    worker_with(language=False)
    response = api_post(alice_client, BODY)
    assert response.status_code == 400, response.content
    why = " ".join(response.json()["errors"]["model"])
    assert f"jargon is text: it trains a language model (byte-llama), not {PLUGIN}" in why
    # Its window is read by language models alone.
    refused = api_post(alice_client, {**BODY, "dataset": "mnist", "seq_len": 48})
    assert "only a language model reads it (byte-llama)" in refused.json()["errors"]["seq_len"][0]
    assert launched == []
