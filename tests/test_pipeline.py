"""``pipeline``: the same training as single at the same global batch under both schedules, each
rank holding its stage only, checkpoints that are the plain model's, and the refusals.

One configuration, tests/test_tensor_parallel.py's (Adam, 4 steps an epoch on the MNIST sample,
tested on 200 of its digits):

- ``single`` at batches of 64 for 2 epochs is the reference;
- ``pipeline`` GPipe over 2 ranks (stages ``features`` and ``classifier``) at --batch-size 64 in 4
  micro-batches of 16 (the stages share the batch: global 64) trains epoch 1 and must end it where
  the reference did; ``single`` resumed from its checkpoint (as the dashboard resumes a lost run
  from its newest checkpoint) must end epoch 2 where the reference did: the Adam moments of both
  stages were gathered whole;
- ``pipeline`` 1F1B in 2 micro-batches resumes the reference's epoch-1 checkpoint and must end
  epoch 2 where the reference did (each stage took its share of the optimizer state back).

The micro-batches' losses are summed where single takes one batch's mean, so sums are taken in
another order: we require tensor-parallel's tolerances (measured here: equal to 1e-6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.factories import api_post
from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.test_catalogue_launch import catalogue_report, machine
from tests.test_tensor_parallel import (
    _checkpoint,
    _run,
    assert_ranks_hold,
    assert_resumes_under_single,
    assert_same_epoch,
)
from tests.test_training import Result
from training import cli
from training.models.simple_cnn import SimpleCNN
from training.refusals import RULE_PIPELINE, option_refusals, pipeline_refusals

pytestmark = pytest.mark.usefixtures("no_processes_left")
slow = pytest.mark.slow  # each torchrun run takes 10-20 s on a loaded 2-core machine

PIPE = ("--strategy", "pipeline", "--nproc", "2", "--batch-size", "64")


@pytest.fixture(scope="module")
def single(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("single")
    return _run(sample_data, out, "single", "--strategy", "single", "--batch-size", "64",
                "--epochs", "2")  # fmt: skip


@pytest.fixture(scope="module")
def gpipe(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("gpipe")
    return _run(sample_data, out, "gpipe", *PIPE, "--microbatches", "4", "--epochs", "1")


@slow
def test_gpipe_two_stages_equal_single(single: Result, gpipe: Result) -> None:
    started = gpipe.started
    assert started["world_size"] == 2 and started["global_batch_size"] == 64
    [note] = [n for n in started["notes"] if n.startswith("Pipeline (GPipe)")]
    assert "stage 0: features; stage 1: classifier" in note
    assert "4 micro-batches of 16" in note
    assert [s["children"] for s in started["stages"]] == [["features"], ["classifier"]]
    # The last stage's loss reached rank 0's reports; every rank evaluated the gathered model.
    assert_same_epoch(gpipe, single, 1)


@slow
def test_each_stage_holds_its_part_only(single: Result, gpipe: Result) -> None:
    model = SimpleCNN()
    held = [
        sum(p.numel() * 4 for p in part.parameters()) for part in (model.features, model.classifier)
    ]
    assert_ranks_hold(single, gpipe, held)


@slow
def test_gpipe_checkpoint_resumes_under_single(
    sample_data: Path, single: Result, gpipe: Result, tmp_path: Path
) -> None:
    assert_resumes_under_single(sample_data, tmp_path, single, gpipe)


@slow
def test_1f1b_resumes_single_and_equals_it(
    sample_data: Path, single: Result, tmp_path: Path
) -> None:
    resume = ("--epochs", "2", "--resume", str(_checkpoint(single, 1)))
    resumed = _run(sample_data, tmp_path, "r-1f1b", *PIPE, "--pipeline-schedule", "1f1b",
                   "--microbatches", "2", *resume)  # fmt: skip
    notes = resumed.started["notes"]
    assert resumed.started["start_epoch"] == 2
    assert any(n.startswith("Pipeline (1F1B)") for n in notes)
    assert any("each stage taking its parameters' share" in n for n in notes), notes
    assert_same_epoch(resumed, single, 2)


# --- the refusals -------------------------------------------------------------------------------


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--nproc", "3"], "the model splits into at most 2 stages"),
        (["--nproc", "1"], "needs 2 or more (got --nproc 1)"),
        (["--batch-size", "30", "--microbatches", "4"], "--batch-size 30 does not cut into 4"),
        (["--pipeline-schedule", "1f1b", "--microbatches", "1"], "got 1 for 2"),
        (["--accumulate", "2"], "--accumulate: applies to --strategy"),
        (["--precision", "bf16"], "--precision: applies to --strategy"),
        (["--compile"], "--compile: applies to --strategy"),
        (["--comm-hook", "fp16"], "--comm-hook: applies to --strategy ddp only, not pipeline"),
        (["--shard-optimizer"], "--shard-optimizer: applies to --strategy ddp only"),
    ],
)
def test_cli_refuses_what_a_pipeline_cannot_run(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--strategy", "pipeline", *(["--nproc", "2"] if "--nproc" not in args else []), *args]
    assert words in _refused(argv, capsys)


@pytest.mark.parametrize("strategy", ["single", "ddp", "tensor-parallel"])
def test_pipeline_options_are_refused_elsewhere(
    strategy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in (["--microbatches", "8"], ["--pipeline-schedule", "1f1b"]):
        err = _refused(["--strategy", strategy, *args], capsys)
        assert f"applies to --strategy pipeline only, not {strategy}" in err
    refused = option_refusals(strategy, values={"microbatches": 8}, gpus=[])
    assert [option.name for option, _ in refused] == ["microbatches"]


def test_pipeline_refusals_are_the_registrys() -> None:
    ok = dict(processes=2, batch_size=64, microbatches=4, schedule="1f1b", stages=2)
    assert pipeline_refusals("pipeline", **ok) == []  # type: ignore[arg-type]
    assert pipeline_refusals("ddp", **{**ok, "microbatches": 5}) == []  # type: ignore[arg-type]
    [refusal] = pipeline_refusals("pipeline", **{**ok, "processes": 3})  # type: ignore[arg-type]
    assert refusal.rule == RULE_PIPELINE and refusal.field == "processes"


@pytest.mark.django_db
def test_api_refuses_what_the_cli_refuses(user_factory: Any, launched: list[int]) -> None:
    machine("host-a", catalogue_report())
    client = Client()
    client.force_login(user_factory())
    response = api_post(client, {"strategy": "pipeline", "batch_size": 30, "microbatches": 4})
    assert response.status_code == 400, response.content
    assert "does not cut into 4 equal micro-batches" in response.json()["errors"]["microbatches"][0]
    response = api_post(client, {"strategy": "pipeline", "accumulate": 2})
    assert response.status_code == 400, response.content
    assert "applies to --strategy" in response.json()["errors"]["accumulate"][0]
    body = {"strategy": "pipeline", "pipeline_schedule": "1f1b", "microbatches": 8}
    response = api_post(client, body)
    assert response.status_code == 201, response.content
    read = client.get(f"/api/experiments/{response.json()['id']}/").json()
    assert (read["pipeline_schedule"], read["microbatches"]) == ("1f1b", 8)


@pytest.mark.django_db
def test_api_refuses_more_stages_than_the_model_has(user_factory: Any, launched: list[int]) -> None:
    """The web server builds a built-in or torchvision model on the meta device to count its
    stages, as the CLI does (simple-cnn: 2, resnet18: 7); a plug-in's model is the worker's to
    count, at start."""
    splittable = ("simple-cnn", "resnet18", "mobilenet_v2", "my-net", "their-net")
    report = catalogue_report(plugins=("my-net", "their-net"), splittable=splittable)
    machine("host-a", {**report, "models_stages": {"their-net": 3}})
    client = Client()
    client.force_login(user_factory())
    for model, stages in (("simple-cnn", 2), ("resnet18", 7)):
        body = {"strategy": "pipeline", "model": model, "processes": stages + 1}
        response = api_post(client, body)
        assert response.status_code == 400, response.content
        why = response.json()["errors"]["processes"][0]
        assert f"splits into at most {stages} stages" in why, why
    body = {"strategy": "pipeline", "model": "resnet18", "processes": 3, "microbatches": 4}
    assert api_post(client, body).status_code == 201
    # A plug-in's count comes from the workers that have it (dashboard.devices.facts); one
    # no worker counted is left to its run.
    plugin = api_post(client, {**body, "model": "their-net", "processes": 4})
    assert plugin.status_code == 400, plugin.content
    assert "at most 3 stages" in plugin.json()["errors"]["processes"][0]
    assert api_post(client, {**body, "model": "their-net", "processes": 3}).status_code == 201
    assert api_post(client, {**body, "model": "my-net", "processes": 4}).status_code == 201
