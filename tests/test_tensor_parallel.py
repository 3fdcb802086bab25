"""``tensor-parallel`` and ``fsdp-tp``: the same training as single at the same global batch, the
split layers at 1/N per rank, checkpoints that are the plain model's, and the refusals.

One configuration, Adam at its default rate, 4 steps an epoch on the MNIST sample (tested on 200
of its digits):

- ``single`` at batches of 64 for 2 epochs is the reference;
- ``tensor-parallel`` over 2 ranks at --batch-size 64 (its ranks share the batch: global 64)
  trains epoch 1, and must end it where the reference did; ``single`` resumed from its
  checkpoint must end epoch 2 where the reference did (the Adam moments were gathered whole);
- ``fsdp-tp`` over 4 ranks (dp 2 x tp 2) at --batch-size 32 (global 64) resumes the reference's
  epoch-1 checkpoint and must end epoch 2 where the reference did (its optimizer state was
  split back over the 2-D mesh, and it trained the reference's steps).

Tolerance: the split layers' sums (the row-wise layer's all-reduce, the gradient of the
column-wise layer's input gathered from both halves) are taken in another order than one
process takes them, so gradients differ by 1e-7 to 1e-6 relative. Adam divides each gradient by
its running RMS: where a gradient is almost nothing (a channel whose ReLU is nearly always shut),
its value is rounding noise, and Adam turns that noise into an update of up to its learning
rate. Measured here: 5.5e-7 relative for tensor-parallel against single, but 6.6e-5 on one
convolution (94 weights of one output channel) for fsdp-tp resumed from single, as for fsdp
resumed from it. We require 2e-4 relative to each tensor's norm for parameters (a lost
all-reduce, a missing optimizer state or another batch move them by 1e-3 or more in one step),
and 1e-5 absolute for losses and test loss (measured: at most 1e-6).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.phase_checks import assert_phases_add_up, phase_windows
from tests.test_catalogue_launch import catalogue_report, machine
from tests.test_exactness import assert_same_parameters
from tests.test_training import Result, assert_well_formed, run_cli
from training import catalogue, cli
from training.models.build import ModelRefused, model_tensor_plan, tensor_plan_widths_check
from training.models.simple_cnn import SimpleCNN
from training.refusals import RULE_MESH, strategy_refusals

STEPS = 4
COMMON = ("--seed", "7", "--steps-per-epoch", str(STEPS), "--log-interval", "1")

pytestmark = pytest.mark.usefixtures("no_processes_left")
slow = pytest.mark.slow  # each torchrun run takes 30-70 s on a loaded 2-core machine


def _run(sample_data: Path, out: Path, run_id: str, *args: str) -> Result:
    result = run_cli(sample_data, *COMMON, "--checkpoint-dir", str(out), "--run-id", run_id, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    if "--resume" in args:  # its epochs start at 2, which assert_well_formed does not expect
        assert result.events[-1]["type"] == "finished"
    else:
        assert_well_formed(result, run_id)
    return result


def _checkpoint(result: Result, epoch: int) -> Path:
    return Path(next(c["path"] for c in result.of_type("checkpoint") if c["epoch"] == epoch))


def _losses(result: Result, epoch: int) -> list[float]:
    return [e["train_loss"] for e in result.of_type("step") if e["epoch"] == epoch]


def _epoch(result: Result, epoch: int) -> dict[str, Any]:
    return next(e for e in result.of_type("epoch") if e["epoch"] == epoch)


def assert_same_epoch(ours: Result, theirs: Result, epoch: int) -> None:
    """The same training in ``epoch``: its losses, its test figures and where it ended."""
    assert len(_losses(ours, epoch)) == STEPS
    assert _losses(ours, epoch) == pytest.approx(_losses(theirs, epoch), abs=1e-5)
    tested, expected = _epoch(ours, epoch), _epoch(theirs, epoch)
    assert tested["test_accuracy"] == expected["test_accuracy"]
    assert tested["test_loss"] == pytest.approx(expected["test_loss"], abs=1e-5)
    assert_same_parameters(_checkpoint(ours, epoch), _checkpoint(theirs, epoch), rtol=2e-4)


def assert_ranks_hold(single: Result, ours: Result, held: list[int]) -> None:
    """Each rank's parameters and gradients are ``held`` bytes, its optimizer state the same share
    of single's (Adam's moments follow their parameters), and its peak was measured."""
    (full,) = _epoch(single, 1)["memory"]
    memory = _epoch(ours, 1)["memory"]
    assert [m["rank"] for m in memory] == list(range(len(held)))
    for rank, size in zip(memory, held, strict=True):
        assert rank["parameter_bytes"] == rank["gradient_bytes"] == size
        ratio = rank["optimizer_state_bytes"] / full["optimizer_state_bytes"]
        assert abs(ratio - size / full["parameter_bytes"]) < 0.001
        assert rank["peak_bytes"] > 0


def assert_resumes_under_single(sample_data: Path, out: Path, single: Result, ours: Result) -> None:
    """Epoch 1's checkpoint of ``ours`` resumed by the single strategy trains epoch 2 as single
    did: the checkpoint holds the whole model and optimizer, whatever split wrote it."""
    resume = ("--epochs", "2", "--resume", str(_checkpoint(ours, 1)))
    resumed = _run(sample_data, out, "r-single", "--strategy", "single",
                   "--batch-size", "64", *resume)  # fmt: skip
    assert resumed.started["start_epoch"] == 2
    assert not any("afresh" in note for note in resumed.started["notes"])
    assert_same_epoch(resumed, single, 2)


@pytest.fixture(scope="module")
def single(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("single")
    return _run(sample_data, out, "single", "--strategy", "single", "--batch-size", "64",
                "--epochs", "2")  # fmt: skip


@pytest.fixture(scope="module")
def tp(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("tp")
    return _run(sample_data, out, "tp", "--strategy", "tensor-parallel", "--nproc", "2",
                "--batch-size", "64", "--epochs", "1")  # fmt: skip


@pytest.fixture(scope="module")
def fsdp_tp(sample_data: Path, single: Result, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("fsdp-tp")
    resume = ("--epochs", "2", "--resume", str(_checkpoint(single, 1)))
    return _run(sample_data, out, "fsdp-tp", "--strategy", "fsdp-tp", "--nproc", "4",
                "--batch-size", "32", *resume)  # fmt: skip


# --- tensor-parallel over 2 ranks ---------------------------------------------------------------


def split_layers_bytes(*, batch: int, ranks: int) -> float:
    """What the split layers' all-reduces send a step, by the ring's 2(N-1)/N x B: the row-wise
    layer's partial outputs in forward (batch x its out_features), the column-wise layer's
    input gradient in backward (batch x its in_features), float32; the plan and widths are the
    model's own."""
    model = SimpleCNN()
    width = {"colwise": lambda lin: lin.in_features, "rowwise": lambda lin: lin.out_features}
    plan = model_tensor_plan("simple-cnn", model)
    floats = sum(width[style](model.get_submodule(path)) for path, style in plan.items())
    return 2 * (ranks - 1) / ranks * 4 * batch * floats


def assert_split_layers_communicate(result: Result, *, batch: int, ranks: int) -> None:
    """DTensor's functional collectives are timed (each rank waits in them) and counted: each
    step sends the split layers' all-reduces, plus the few bytes of the ranks' own figures
    (whether a checkpoint was requested)."""
    expected = split_layers_bytes(batch=batch, ranks=ranks)
    for steps, rank in phase_windows(result):
        assert rank["communication_seconds"] > 0, rank
        assert steps * expected <= rank["communication_bytes"] <= steps * (expected + 64), rank


@slow
def test_tensor_parallel_two_ranks_equal_single(single: Result, tp: Result) -> None:
    assert tp.started["world_size"] == 2 and tp.started["global_batch_size"] == 64
    assert_phases_add_up(tp)
    assert_split_layers_communicate(tp, batch=64, ranks=2)
    [note] = [n for n in tp.started["notes"] if n.startswith("Tensor parallel")]
    assert "classifier.1 column-wise, classifier.3 row-wise" in note
    assert "the global batch is --batch-size (64)" in note
    # Every rank evaluated the whole test split through the split layers: single's figures.
    assert_same_epoch(tp, single, 1)


@slow
def test_tensor_parallel_ranks_hold_half_of_the_split_layers(single: Result, tp: Result) -> None:
    whole = {name: p.numel() * 4 for name, p in SimpleCNN().named_parameters()}
    # The split layers' weights and the column-wise bias at half; the row-wise layer's bias
    # (added once, after the all-reduce) and the convolutions whole on each rank.
    split = ("classifier.1.weight", "classifier.1.bias", "classifier.3.weight")
    held = sum(size // 2 if name in split else size for name, size in whole.items())
    (full,) = _epoch(single, 1)["memory"]
    assert full["parameter_bytes"] == sum(whole.values())
    assert_ranks_hold(single, tp, [held, held])


@slow
def test_tensor_parallel_checkpoint_resumes_under_single(
    sample_data: Path, single: Result, tp: Result, tmp_path: Path
) -> None:
    assert_resumes_under_single(sample_data, tmp_path, single, tp)


# --- fsdp-tp over 4 ranks -----------------------------------------------------------------------


@slow
def test_fsdp_tp_four_ranks_resume_single_and_equal_it(single: Result, fsdp_tp: Result) -> None:
    started = fsdp_tp.started
    assert started["world_size"] == 4 and started["global_batch_size"] == 64
    assert_phases_add_up(fsdp_tp)
    # Besides FSDP2's gathers over dp (counted once, though they gather DTensors), each pair's
    # all-reduces over tp.
    for _, rank in phase_windows(fsdp_tp):
        assert rank["communication_seconds"] > 0
        assert rank["communication_bytes"] > split_layers_bytes(batch=32, ranks=2)
    assert started["start_epoch"] == 2
    [note] = [n for n in started["notes"] if n.startswith("FSDP2 + tensor parallel")]
    assert "dp 2 x tp 2" in note and "64 a step over 2 pairs" in note
    assert any("sharded over the ranks" in n for n in started["notes"])
    # Each pair evaluated its half of the test split, its FSDP2 shards gathered.
    assert_same_epoch(fsdp_tp, single, 2)


@slow
def test_fsdp_tp_ranks_hold_a_quarter(single: Result, fsdp_tp: Result) -> None:
    (full,) = _epoch(single, 2)["memory"]
    memory = _epoch(fsdp_tp, 2)["memory"]
    assert [m["rank"] for m in memory] == [0, 1, 2, 3]
    for rank in memory:
        for field in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"):
            # The split layers at 1/4 (tp, then dp), the convolutions at 1/2 (dp): 25.3%.
            assert 0.24 < rank[field] / full[field] < 0.27, field


# --- the plan and the refusals ------------------------------------------------------------------


def test_simple_cnn_declares_its_plan_and_widths_are_checked() -> None:
    model = SimpleCNN()
    plan = model_tensor_plan("simple-cnn", model)
    assert plan == {"classifier.1": "colwise", "classifier.3": "rowwise"}
    tensor_plan_widths_check("simple-cnn", model, plan, 4)
    with pytest.raises(ModelRefused, match="its 128 output features do not divide by 3"):
        tensor_plan_widths_check("simple-cnn", model, plan, 3)
    entries = {e.name: e for e in catalogue.model_entries()}
    assert catalogue.model_tensor_parallel(entries["simple-cnn"])
    assert not catalogue.model_tensor_parallel(entries["resnet18"])


@pytest.mark.parametrize("strategy", ["tensor-parallel", "fsdp-tp"])
def test_cli_refuses_a_model_with_no_plan(
    strategy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--strategy", strategy, "--nproc", "4", "--model", "resnet18"])
    assert exc.value.code == 2
    assert "resnet18 declares none" in capsys.readouterr().err


@pytest.mark.parametrize("nproc", [2, 3, 5])
def test_cli_refuses_fsdp_tp_where_the_ranks_do_not_factor(
    nproc: int, capsys: pytest.CaptureFixture[str]
) -> None:
    [refusal] = strategy_refusals("fsdp-tp", processes=nproc, gpus=[])
    assert refusal.rule == RULE_MESH
    with pytest.raises(SystemExit) as exc:
        cli.main(["--strategy", "fsdp-tp", "--nproc", str(nproc)])
    assert exc.value.code == 2
    assert refusal.cli_message in capsys.readouterr().err
    assert f"(got --nproc {nproc})" in refusal.cli_message
    assert strategy_refusals("fsdp-tp", processes=6, gpus=[]) == []


def _post(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/experiments/", json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_api_refuses_what_the_cli_refuses(user_factory: Any, launched: list[int]) -> None:
    report = catalogue_report()
    report["models_tensor_parallel"] = ["simple-cnn"]
    machine("host-a", report)
    client = Client()
    client.force_login(user_factory())
    response = _post(client, {"strategy": "tensor-parallel", "model": "resnet18"})
    assert response.status_code == 400, response.content
    assert "resnet18 declares none" in response.json()["errors"]["model"][0]
    response = _post(client, {"strategy": "fsdp-tp", "processes": 3})
    assert response.status_code == 400, response.content
    assert "2-D mesh" in response.json()["errors"]["processes"][0]
    assert "(got 3)" in response.json()["errors"]["processes"][0]
    for body in ({"strategy": "tensor-parallel"}, {"strategy": "fsdp-tp", "processes": 4}):
        assert _post(client, body).status_code == 201, body
