"""Models other than ours (issue 17, the engine's side): the catalogue's models built for a
dataset (``training.models.build``), ``--model`` / ``--weights`` / ``--sync-batchnorm`` through
``python -m training``, a real plug-in package, and every strategy on a torchvision model.

All on the real MNIST sample (28x28, 1 channel, 10 classes), a few steps each, evaluated on 200
of its test digits (tests/few_digits.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchvision import models as tv_models

from dashboard.devices.facts import plugin_stages_count
from tests.conftest import need
from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.plugin_package import plugin_package_write
from tests.test_exactness import assert_same_parameters
from tests.test_training import ROOT, Result, assert_well_formed, run_cli
from training import cli
from training.data.datasets import DatasetMeta, dataset_meta, load_dataset, to_batch
from training.models.build import InputResize, ModelRefused, model_build_for, model_tensor_plan

pytestmark = pytest.mark.usefixtures("no_processes_left")
slow = pytest.mark.slow
SHORT = ("--epochs", "1", "--steps-per-epoch", "3", "--log-interval", "1")


def _mnist_batch(sample_data: Path, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Real digits, normalised as training feeds them."""
    data = load_dataset("mnist", sample_data)
    return to_batch(data.test, torch.arange(n), torch.device("cpu"), data.mean, data.std)


def _meta(sample_data: Path) -> DatasetMeta:
    return dataset_meta("mnist", sample_data, None)


# --- building, in process ----------------------------------------------------------------------


def test_simple_cnn_and_resnet18_are_built_for_mnist(sample_data: Path) -> None:
    x, _ = _mnist_batch(sample_data)
    simple = model_build_for(name="simple-cnn", meta=_meta(sample_data))
    assert simple.info == {
        "name": "simple-cnn", "source": "built in", "in_channels": 1, "num_classes": 10,
        "image_size": 28, "input_size": 28, "parameters": simple.info["parameters"],
    }  # fmt: skip
    # At MNIST's size the built-in is the one checkpoints always held.
    from training.models.simple_cnn import SimpleCNN

    assert simple.model.state_dict().keys() == SimpleCNN().state_dict().keys()
    resnet = model_build_for(name="resnet18", meta=_meta(sample_data))
    assert resnet.notes[0].startswith("resnet18: first convolution takes 1 channel, 10 classes")
    assert resnet.model.conv1.in_channels == 1  # type: ignore[union-attr]
    assert resnet.info["source"] == "torchvision" and resnet.info["input_size"] == 28
    assert resnet.model(x).shape == (8, 10)
    # The first convolution is the only change: every other tensor is torchvision's.
    plain = tv_models.resnet18(num_classes=10).state_dict()
    built = resnet.model.state_dict()
    assert built.keys() == plain.keys()
    assert [k for k in plain if plain[k].shape != built[k].shape] == ["conv1.weight"]


def test_inception_v3_takes_mnist_resized_to_its_smallest_size(sample_data: Path) -> None:
    x, _ = _mnist_batch(sample_data, 4)
    with pytest.raises(RuntimeError):  # as torchvision builds it, 28x28 is too small
        tv_models.inception_v3(num_classes=10, aux_logits=False, init_weights=True).eval()(
            x.expand(-1, 3, -1, -1)
        )
    built = model_build_for(name="inception_v3", meta=_meta(sample_data))
    assert built.info["image_size"] == 28 and built.info["input_size"] == 75
    assert any("resized to 75x75" in note for note in built.notes), built.notes
    assert [type(h) for h in built.model._forward_pre_hooks.values()] == [InputResize]
    built.model.train()  # aux_logits off: training mode gives plain logits the loss takes
    out = built.model(x)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 10)
    # The input stage holds no weights: the state dict is the plain model's.
    plain = tv_models.inception_v3(num_classes=10, aux_logits=False, init_weights=True)
    assert built.model.state_dict().keys() == plain.state_dict().keys()


def test_an_unknown_model_is_refused_with_close_matches(sample_data: Path) -> None:
    with pytest.raises(ModelRefused, match="did you mean resnet18"):
        model_build_for(name="resnet-18", meta=_meta(sample_data))


# --- the CLI -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--model", "resnet-18"], "did you mean resnet18"),
        (["--model", "no-such-net"], "argument --model: unknown model 'no-such-net'"),
        (["--weights", "/nonexistent.pt"], "argument --weights: no file"),
        (["--sync-batchnorm"], "applies to --strategy ddp only, not single"),
        (["--strategy", "ddp", "--sync-batchnorm"], "SyncBatchNorm does not run on CPU"),
    ],
)
def test_model_arguments_are_refused(sample_data: Path, args: list[str], said: str) -> None:
    result = run_cli(sample_data, *args, timeout=60)
    assert result.returncode == 2 and result.events == []
    assert said in result.stderr, result.stderr[-2000:]


def _state(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, weights_only=True)["model"]
    return state


def test_weights_round_trip_and_another_models_checkpoint(
    sample_data: Path, tmp_path: Path
) -> None:
    first = run_cli(sample_data, *SHORT, "--checkpoint-dir", str(tmp_path / "a"), "--run-id", "w1")
    assert_well_formed(first, "w1")
    assert first.started["model"] == "simple-cnn"
    checkpoint = Path(first.of_type("checkpoint")[-1]["path"])
    assert torch.load(checkpoint, weights_only=True)["config"]["model"] == "simple-cnn"
    weights = tmp_path / "weights.pt"
    torch.save(_state(checkpoint), weights)  # a plain state dict, as a user brings one
    # One step at a learning rate of 1e-9 leaves the weights where --weights put them.
    second = run_cli(
        sample_data, "--epochs", "1", "--steps-per-epoch", "1", "--optimizer", "sgd",
        "--lr", "1e-9", "--weights", str(weights), "--checkpoint-dir", str(tmp_path / "b"),
        "--run-id", "w2",
    )  # fmt: skip
    assert_well_formed(second, "w2")
    assert any("weights loaded from" in n for n in second.started["notes"])
    loaded, saved = _state(Path(second.of_type("checkpoint")[-1]["path"])), _state(checkpoint)
    for name, tensor in saved.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=1e-6)
    # The same file does not fit another model: refused, naming what differs.
    misfit = run_cli(sample_data, *SHORT, "--model", "resnet18", "--weights", str(weights))
    assert misfit.returncode == 1
    assert "does not fit resnet18" in misfit.events[-1]["error"]
    assert "missing (conv1.weight" in misfit.events[-1]["error"]
    # Nor does its checkpoint resume another model.
    other = run_cli(sample_data, *SHORT, "--model", "resnet18", "--resume", str(checkpoint))
    assert other.returncode == 1 and other.events[-1]["type"] == "failed"
    assert (
        "holds the weights of --model simple-cnn, not of --model resnet18"
        in other.events[-1]["error"]
    )


# --- a real plug-in package ----------------------------------------------------------------------

PLUGIN = '''
"""A model of the user's own, found through its entry points."""
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, num_classes, in_channels, image_size):
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * image_size * image_size, 64), nn.ReLU()
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def build(*, num_classes, in_channels, image_size):
    return TinyNet(num_classes, in_channels, image_size)


build.stages = lambda model: [("body", model.body), ("head", model.head)]
build.tensor_parallel = lambda model: {"body.1": "colwise", "head": "rowwise"}


def build_plain(*, num_classes, in_channels, image_size):
    return TinyNet(num_classes, in_channels, image_size)
'''


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package as pip would install it: a module and its ``.dist-info`` on a path."""
    return plugin_package_write(
        tmp_path_factory.mktemp("plugin"), module="tinynet", source=PLUGIN,
        group="trainyard.models",
        entry_points={"tiny-net": "tinynet:build", "tiny-plain": "tinynet:build_plain"},
    )  # fmt: skip


def _with_plugin(sample_data: Path, plugin_path: Path, *args: str) -> Result:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(
        TRAINYARD_DATA_DIR=str(sample_data), TRAINYARD_NO_DOWNLOAD="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(plugin_path)]),
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    if args[0] == "training.catalogue":
        return Result(proc.returncode, [json.loads(proc.stdout)], proc.stderr)
    return Result(proc.returncode, [json.loads(x) for x in proc.stdout.splitlines()], proc.stderr)


def test_a_plugin_package_is_listed_and_trained(sample_data: Path, plugin_path: Path) -> None:
    listed = _with_plugin(sample_data, plugin_path, "training.catalogue").events[0]
    assert {"tiny-net", "tiny-plain"} <= set(listed["models"])
    assert listed["model_sources"]["tiny-net"] == "plug-in tinynet"
    assert "tiny-net" in listed["models_splittable"]
    assert "tiny-plain" not in listed["models_splittable"]
    assert "tiny-net" in listed["models_tensor_parallel"]
    assert "tiny-plain" not in listed["models_tensor_parallel"]
    single = _with_plugin(
        sample_data, plugin_path, "training", "--model", "tiny-net", "--run-id", "p",
        "--epochs", "1", "--steps-per-epoch", "20",
    )  # fmt: skip
    assert_well_formed(single, "p")
    assert single.started["model_info"]["source"] == "plug-in tinynet"
    assert single.started["model_info"]["parameters"] == 28 * 28 * 64 + 64 + 64 * 10 + 10
    assert single.finished["test_accuracy"] > 0.5  # 20 steps of 64 real digits; chance is 0.1
    # Its declared stages are what model-parallel places.
    split = _with_plugin(
        sample_data, plugin_path, "training", "--model", "tiny-net", "--strategy",
        "model-parallel", "--run-id", "ps", *SHORT,
    )  # fmt: skip
    assert_well_formed(split, "ps")
    assert [s["children"] for s in split.started["stages"]] == [["body"], ["head"]]
    # One that declares none is refused, with the reason.
    plain = _with_plugin(
        sample_data, plugin_path, "training", "--model", "tiny-plain", "--strategy",
        "model-parallel", *SHORT,
    )  # fmt: skip
    assert plain.returncode == 1
    assert "its build declares no stages" in plain.events[-1]["error"]


def test_a_plugin_declares_its_tensor_parallel_plan(
    plugin_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What tensor-parallel and fsdp-tp split a plug-in's model by: its build's own plan."""
    monkeypatch.syspath_prepend(str(plugin_path))  # its entry points are found on sys.path
    import tinynet  # type: ignore[import-not-found]

    model = tinynet.build(num_classes=10, in_channels=1, image_size=28)
    assert model_tensor_plan("tiny-net", model) == {"body.1": "colwise", "head": "rowwise"}
    with pytest.raises(ModelRefused, match="tiny-plain declares none"):
        model_tensor_plan("tiny-plain", model)


def test_a_worker_counts_its_plugins_pipeline_stages(
    plugin_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the workers have a plug-in: their report says how many stages each splittable one
    cuts into, for the launch checks (tests/test_pipeline.py reads it there)."""
    monkeypatch.syspath_prepend(str(plugin_path))
    report = {
        "models_splittable": ["simple-cnn", "tiny-net"],
        "model_sources": {"simple-cnn": "built in", "tiny-net": "plug-in tinynet"},
    }
    assert plugin_stages_count(report) == {"tiny-net": 2}


# --- every strategy on a torchvision model -------------------------------------------------------


def test_model_parallel_splits_resnet18(sample_data: Path, tmp_path: Path) -> None:
    result = run_cli(
        sample_data, "--model", "resnet18", "--strategy", "model-parallel", "--run-id", "mp18",
        "--checkpoint-dir", str(tmp_path), *SHORT,
    )  # fmt: skip
    assert_well_formed(result, "mp18")
    stages = result.started["stages"]
    assert [s["children"] for s in stages] == [
        ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"],
        ["layer4", "avgpool", "fc"],
    ]
    assert [s["device"] for s in stages] == ["cpu", "cpu"]
    assert sum(s["parameters"] for s in stages) == result.started["model_info"]["parameters"]
    # The split leaves the state dict alone: any strategy resumes it.
    keys = _state(Path(result.of_type("checkpoint")[-1]["path"])).keys()
    assert keys == tv_models.resnet18().state_dict().keys()


def test_hogwild_trains_inception_v3_resized(sample_data: Path) -> None:
    result = run_cli(
        sample_data, "--model", "inception_v3", "--strategy", "hogwild", "--nproc", "2",
        "--dry-run", "--batch-size", "8", "--run-id", "hwi",
    )  # fmt: skip
    assert_well_formed(result, "hwi")
    assert result.started["model_info"]["input_size"] == 75
    # The processes train the parent's model as built (shared, its input stage pickled along),
    # not a model of their own.
    [conv] = [
        t for t in result.started["shared_tensors"]
        if t["name"] == "model.Conv2d_1a_3x3.conv.weight"
    ]  # fmt: skip
    assert conv["is_shared"] and conv["shape"] == [32, 1, 3, 3]


def test_ddp_on_resnet18_says_batchnorm_is_per_rank(sample_data: Path) -> None:
    result = run_cli(
        sample_data, "--model", "resnet18", "--strategy", "ddp", "--nproc", "2", "--dry-run",
        "--run-id", "ddp18",
    )  # fmt: skip
    assert_well_formed(result, "ddp18")
    assert any(
        "20 BatchNorm layer(s)" in n and "its own shard's batch statistics" in n
        for n in result.started["notes"]
    ), result.started["notes"]


@slow  # DeepSpeed's start alone is about 20 s here
def test_deepspeed_trains_resnet18(sample_data: Path) -> None:
    need(cli.deepspeed_available(), "deepspeed is not installed")
    result = run_cli(
        sample_data, "--model", "resnet18", "--strategy", "deepspeed", "--nproc", "2",
        "--dry-run", "--run-id", "ds18",
    )  # fmt: skip
    assert_well_formed(result, "ds18")
    assert result.started["model_info"]["name"] == "resnet18"


# ViT is torchvision's one classifier with neither BatchNorm (per-rank statistics under DDP)
# nor dropout or stochastic depth (random masks that differ between one process and two): the
# one whose DDP step is the single process's step. Built for 32x32 (MNIST resized), 85M
# parameters: three small steps, and evaluating 200 test digits (1,000 took 70 s here).
@slow
def test_ddp_equals_single_on_vit(sample_data: Path, tmp_path: Path) -> None:
    common = (
        "--model", "vit_b_16", "--optimizer", "sgd", "--lr", "0.01", "--seed", "3",
        "--epochs", "1", "--steps-per-epoch", "3", "--test-batch-size", "500",
    )  # fmt: skip
    single = run_cli(
        sample_data, *common, "--batch-size", "8", "--checkpoint-dir", str(tmp_path / "s"),
        "--run-id", "vs",
    )  # fmt: skip
    assert_well_formed(single, "vs")
    assert single.started["model_info"]["input_size"] == 32
    ddp = run_cli(
        sample_data, *common, "--strategy", "ddp", "--nproc", "2", "--batch-size", "4",
        "--checkpoint-dir", str(tmp_path / "d"), "--run-id", "vd",
    )  # fmt: skip
    assert_well_formed(ddp, "vd")
    assert ddp.started["global_batch_size"] == 8
    assert not any("BatchNorm" in n for n in ddp.started["notes"])
    ours = Path(single.of_type("checkpoint")[0]["path"])
    theirs = Path(ddp.of_type("checkpoint")[0]["path"])
    assert_same_parameters(theirs, ours, rtol=1e-5)  # test_exactness.py's tolerance
    # ... and both moved away from the seed's weights (three steps did train).
    torch.manual_seed(3)
    initial = model_build_for(name="vit_b_16", meta=_meta(sample_data)).model.state_dict()
    head = "heads.head.weight"
    assert not torch.allclose(_state(ours)[head], initial[head])


def test_simple_cnn_pools_large_images_instead_of_growing() -> None:
    """At 224x224 its first linear layer would hold 103M weights; pooled to 14x14 it keeps
    the 28x28 model's size, and the 28x28 state dict is unchanged."""
    from training.models.simple_cnn import SimpleCNN

    small, large = SimpleCNN(), SimpleCNN(10, 3, 224)
    size = sum(p.numel() for p in large.parameters())
    assert size < 1.01 * sum(p.numel() for p in small.parameters())
    assert large(torch.zeros(2, 3, 224, 224)).shape == (2, 10)
    assert list(small.state_dict()) == list(large.state_dict())
