"""The training engine's strategies beyond single/dp/ddp (those are in test_training.py): each
trains one real epoch on the MNIST sample and beats chance (10%) by a wide margin; what each
refuses; the shared copy of the dataset. (tests/test_strategies.py is the dashboard's side.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from tests.conftest import need, no_new_processes
from tests.phase_checks import assert_phases_add_up
from tests.test_protocol import assert_typed
from tests.test_training import (
    GPU_COUNT,
    Result,
    _start,
    assert_well_formed,
    needs_cuda,
    run_cli,
    run_cli_asking_checkpoint,
    sigterm_at_first_step,
)
from tests.test_training_target import TARGET, assert_ended_at_target
from training import cli
from training.data.shared_data import (
    PREFIX,
    dataset_segment_create,
    segment_attach,
    segment_create,
    segment_owned,
    segment_path,
    segments_of,
    stale_segments_remove,
)
from training.protocol import EVENT_TYPES

# Written for a script run only (its figures, metrics), or only where ranks stop stepping
# (stalled: tests/test_engine_stall.py).
NOT_WRITTEN = {"metrics", "stalled"}

# One epoch of the 4,000-image sample; 80% is far above chance and reached by every strategy.
ACCURACY = 0.8


pytestmark = pytest.mark.usefixtures("no_processes_left")


# --- one epoch each, on the CPU ----------------------------------------------------------------


def assert_requested_checkpoint_loads(result: Any) -> None:
    """The checkpoint asked for at `started` holds a whole SimpleCNN, whatever the strategy."""
    from training.models.simple_cnn import SimpleCNN

    [event] = [c for c in result.of_type("checkpoint") if c["requested"]]
    state = torch.load(event["path"], weights_only=True)
    assert state["step"] == event["step"] and state["images_into_epoch"] > 0
    SimpleCNN().load_state_dict(state["model"])  # strict: every key, right shapes


@pytest.fixture(scope="module")
def model_parallel(sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    """One model-parallel epoch with its checkpoints (one asked for at ``started``, one at the
    epoch's end): its own test reads the run, the started-alike test resumes its checkpoint."""
    folder = tmp_path_factory.mktemp("model-parallel")
    # Set up before the tests' own no_processes_left: checked here instead.
    with no_new_processes():
        result = run_cli_asking_checkpoint(
            sample_data, "--strategy", "model-parallel", "--checkpoint-dir", str(folder),
            "--run-id", "mp",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_model_parallel_on_the_cpu_says_so(model_parallel: Result) -> None:
    result = model_parallel
    assert_well_formed(result, "mp")
    assert_requested_checkpoint_loads(result)
    # Every type but a failure and a profile (asked for only), each with every field of its type.
    assert {e["type"] for e in result.events} == EVENT_TYPES - NOT_WRITTEN - {"failed", "profile"}
    assert_typed(result.events, every=True)
    started = result.started
    # The built-in's top-level children, one a stage (1.6 adds each stage's children).
    assert [(s["name"], s["device"], s["children"]) for s in started["stages"]] == [
        ("features", "cpu", ["features"]),
        ("classifier", "cpu", ["classifier"]),
    ]
    assert started["devices"] == ["cpu", "cpu"]
    assert any("both stages" in n and "no parallelism" in n for n in started["notes"])
    # One process: its phases add up to its wall time and none of it is communication.
    assert_phases_add_up(result)
    assert all(r["communication_seconds"] == 0 for e in result.of_type("step") for r in e["ranks"])
    assert result.finished["test_accuracy"] > ACCURACY


def test_hogwild_two_processes_share_model_and_data(sample_data: Path, tmp_path: Path) -> None:
    # Two epochs planned, the target met after the first: Hogwild's stop at target, checked here
    # rather than in a run of its own (tests/test_training_target.py).
    result = run_cli(
        sample_data, "--strategy", "hogwild", "--nproc", "2", "--checkpoint-dir", str(tmp_path),
        "--run-id", "hw", "--epochs", "2", *TARGET,
    )  # fmt: skip
    assert_well_formed(result, "hw", epochs_run=1)
    assert_ended_at_target(result, epochs=2)
    assert {e["type"] for e in result.events} == EVENT_TYPES - NOT_WRITTEN - {"failed", "profile"}
    assert_typed(result.events, every=True)  # its shared tensors' entries too
    started = result.started
    assert started["world_size"] == 2
    pids = started["pids"]
    assert len(set(pids)) == 2 and result.pid not in pids
    assert started["launcher_pid"] == result.pid
    shared = {t["name"]: t for t in started["shared_tensors"]}
    # Every parameter, in the parent and in both workers, is in shared memory.
    params = {name for name in shared if name.startswith("model.")}
    assert params == {f"model.{n}" for n, _ in _model_parameters()}
    assert all(shared[n]["is_shared"] for n in params)
    assert shared["model.classifier.1.weight"]["bytes"] == 128 * 64 * 14 * 14 * 4
    assert all(shared[n]["is_shared"] for n in ("train.images", "test.images"))
    # Each worker takes half of every global batch of 2 x 64: 4,000 / 128 per worker.
    assert started["steps_per_epoch"] == 32
    for event in result.of_type("step"):
        assert len(event["ranks"]) == 2
    assert result.finished["test_accuracy"] > ACCURACY
    assert not [pid for pid in pids if psutil.pid_exists(pid)], "workers outlived the run"

    # Each worker's own optimizer state is kept (worker 0's is the one other strategies take),
    # and a Hogwild run on as many workers gives each its own back.
    state = torch.load(tmp_path / "epoch-1.pt", weights_only=True)
    own = state["worker_optimizers"]
    assert len(own) == 2 and own[0]["state"] and own[1]["state"]
    first = own[0]["state"][0]["exp_avg"]
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], first)
    assert not torch.equal(own[1]["state"][0]["exp_avg"], first)
    resumed = run_cli(
        sample_data, "--strategy", "hogwild", "--nproc", "2", "--epochs", "2",
        "--steps-per-epoch", "3", "--resume", str(tmp_path / "epoch-1.pt"), "--run-id", "hwr",
    )  # fmt: skip
    # Epoch 1 had 32 steps, epoch 2 has 3 (--steps-per-epoch): not the usual shape of a run.
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.started["start_epoch"] == 2 and resumed.finished["steps"] == 32 + 3
    assert any("Each of the 2 workers resumed its own" in n for n in resumed.started["notes"])


def test_hogwild_and_the_shared_loop_say_started_alike(
    sample_data: Path, model_parallel: Result
) -> None:
    """One driver for both (training/epochs.py): Hogwild's parent and the shared loop carry the
    same started fields, and a checkpoint that covers every epoch is said in the same words."""
    # The model-parallel epoch's: any strategy resumes a SimpleCNN's checkpoint.
    [written] = [c["path"] for c in model_parallel.of_type("checkpoint") if not c["requested"]]
    resumed = [
        run_cli(sample_data, "--dry-run", *flags, "--resume", written)
        for flags in (("--strategy", "single"), ("--strategy", "hogwild", "--nproc", "1"))
    ]
    single, hogwild = resumed
    assert [r.returncode for r in resumed] == [0, 0], hogwild.stderr
    assert set(hogwild.started) == set(single.started)
    assert (single.started["strategy"], hogwild.started["strategy"]) == ("single", "hogwild")
    covered = "The checkpoint already covers 1 epoch(s); nothing to train."
    for result in resumed:
        assert covered in [e["message"] for e in result.of_type("log")], result.of_type("log")
        assert result.finished["epochs_run"] == 0


def test_hogwild_sigterm_stops_every_worker(sample_data: Path) -> None:
    proc = _start(
        sample_data, "--strategy", "hogwild", "--nproc", "2", "--dry-run", "--epochs", "1000"
    )
    pids, failed = sigterm_at_first_step(proc)
    assert proc.returncode == 143
    assert failed and "SIGTERM" in failed[0]["error"]
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert segments_of(proc.pid) == []


def test_deepspeed_zero1_on_two_cpu_ranks(sample_data: Path, tmp_path: Path) -> None:
    need(cli.deepspeed_available(), "deepspeed is not installed (pip install -e '.[deepspeed]')")
    result = run_cli_asking_checkpoint(
        sample_data, "--strategy", "deepspeed", "--nproc", "2", "--checkpoint-dir", str(tmp_path),
        "--run-id", "ds", "--epochs", "2", *TARGET, timeout=400,
    )  # fmt: skip
    assert_well_formed(result, "ds", epochs_run=1)
    assert_ended_at_target(result, epochs=2)  # every rank stops with rank 0's evaluation
    assert_requested_checkpoint_loads(result)
    started = result.started
    assert (started["world_size"], started["zero_stage"]) == (2, 1)
    assert started["devices"] == ["cpu", "cpu"]
    assert all(t["is_shared"] for t in started["shared_tensors"])
    assert any("ZeRO stage 1" in n for n in started["notes"])
    assert_phases_add_up(result)
    assert result.finished["test_accuracy"] > ACCURACY
    # DeepSpeed's JIT-compiled CPU all-reduce kernel is not built (see deepspeed_zero.py).
    assert "deepspeed_shm_comm" not in result.stderr
    # ZeRO is given torch's own Adam, the class it knows (training/strategies/optimizers.py's would
    # warn).
    assert "untested optimizer" not in result.stderr


@pytest.mark.skipif(GPU_COUNT < 2, reason=f"needs 2 or more GPUs; this machine has {GPU_COUNT}")
@pytest.mark.gpu
def test_dp_primitives_over_two_gpus(sample_data: Path) -> None:
    result = run_cli(sample_data, "--strategy", "dp-primitives", "--gpus", "0,1", "--run-id", "dpp")
    assert_well_formed(result, "dpp")
    assert result.started["devices"] == ["cuda:0", "cuda:1"]
    assert result.finished["test_accuracy"] > ACCURACY


@pytest.mark.gpu
@needs_cuda
def test_model_parallel_gpu_and_cpu(sample_data: Path) -> None:
    result = run_cli(sample_data, "--strategy", "model-parallel", "--gpus", "0", "--run-id", "mpg")
    assert_well_formed(result, "mpg")
    assert [s["device"] for s in result.started["stages"]] == ["cuda:0", "cpu"]
    assert result.finished["test_accuracy"] > ACCURACY


@pytest.mark.gpu
@needs_cuda
def test_deepspeed_nccl_on_one_gpu(sample_data: Path) -> None:
    need(cli.deepspeed_available(), "deepspeed is not installed (pip install -e '.[deepspeed]')")
    result = run_cli(
        sample_data,
        "--strategy",
        "deepspeed",
        "--zero-stage",
        "2",
        "--nproc",
        "1",
        "--gpus",
        "0",
        "--run-id",
        "dsg",
    )
    assert_well_formed(result, "dsg")
    assert result.started["zero_stage"] == 2
    assert result.finished["test_accuracy"] > ACCURACY


# --- refusals: in this process, parse and validate only (exit status 2) ----------------------


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.skipif(GPU_COUNT >= 2, reason="checks the refusal on a machine with fewer than 2 GPUs")
def test_dp_primitives_refused_without_two_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(capsys, "--strategy", "dp-primitives")
    assert "dp-primitives needs 2 or more GPUs" in err
    assert f"this machine has {GPU_COUNT} GPU(s)" in err
    # What is available instead: the strategies that need no GPU (from the registry).
    instead = err.split("on the CPU use --strategy ", 1)[1]
    assert "single" in instead and "hogwild" in instead and "dp-primitives" not in instead


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--strategy", "nope"], "'model-parallel', 'hogwild', 'deepspeed'"),
        (["--strategy", "hogwild", "--gpus", "0"], "hogwild keeps the model in shared host"),
        (["--strategy", "model-parallel", "--gpus", "0,1,2"], "give at most two GPUs"),
        (["--strategy", "ddp", "--zero-stage", "2"], "applies to --strategy deepspeed only"),
        (
            ["--strategy", "deepspeed", "--zero-stage", "3"],
            "argument --zero-stage: invalid choice: 3",
        ),
        (["--strategy", "deepspeed", "--nproc", "2", "--gpus", "0"], "--nproc must equal"),
        (["--keep-checkpoints", "-1"], "--keep-checkpoints"),
        (["--steps-per-epoch", "0"], "--steps-per-epoch"),
        pytest.param(
            ["--strategy", "model-parallel", "--gpus", "0"],
            "CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="GPU-less behaviour"),
        ),
    ],
)
def test_bad_combinations_are_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert expected in _refused(capsys, *argv)


def test_deepspeed_missing_is_refused_with_the_install_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as if not installed
    err = _refused(capsys, "--strategy", "deepspeed")
    assert "needs the optional DeepSpeed package" in err
    assert "DS_BUILD_OPS=0 pip install --no-build-isolation 'deepspeed==0.19.8'" in err


# --- the shared copy of the dataset ------------------------------------------------------------


def test_segment_is_one_copy_mapped_by_path_and_leaves_nothing(
    sample_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.data.datasets import load_dataset, resident
    from training.data.sources import data_plan

    monkeypatch.setenv("TRAINYARD_NO_DOWNLOAD", "1")
    path = segment_path(os.getpid(), "test-segment")
    with segment_owned(path):
        owner, segment = dataset_segment_create(
            data_plan("mnist", sample_data, None), "planned", path
        )
        other = segment_attach(segment)
        assert path.exists()
    assert not path.exists()  # unlinked, yet both mappings live on
    private = load_dataset("mnist", sample_data)
    (o_train, o_test), (a_train, a_test), (p_train, p_test) = (
        (resident(d.train), resident(d.test)) for d in (owner, other, private)
    )
    for train, test, train2, test2 in (
        (o_train, o_test, a_train, a_test),
        (a_train, a_test, p_train, p_test),
    ):
        assert torch.equal(train.images, train2.images)
        assert torch.equal(test.labels, test2.labels)
    assert o_train.images.is_shared() and a_train.labels.is_shared()
    assert not p_train.images.is_shared()
    # The same pages, not a copy: a write through one mapping shows in the other.
    assert o_train.images.data_ptr() != a_train.images.data_ptr()
    a_test.labels[0] = 123
    assert int(o_test.labels[0]) == 123
    assert owner.source == private.source and owner.substitute
    # The stats travel with the segment: the attaching process computes nothing.
    assert other.mean == owner.mean == private.mean and owner.notes == other.notes


def test_segment_holds_any_shapes_its_fill_writes(tmp_path: Path) -> None:
    """segment_create knows tensors by shape and dtype only; the fill writes them in place."""
    path = segment_path(os.getpid(), "test-shapes")
    shapes = {"a": ((3, 1, 2, 2), torch.uint8), "b": ((3,), torch.int64)}

    def fill(tensors: dict[str, torch.Tensor]) -> None:
        tensors["a"].copy_(torch.arange(12, dtype=torch.uint8).view(3, 1, 2, 2))
        tensors["b"].fill_(7)

    with segment_owned(path):
        tensors, segment = segment_create(path, shapes, fill)
        assert [t.offset % 64 for t in segment.tensors] == [0, 0]
    assert not path.exists()
    assert tensors["a"].is_shared() and tensors["a"].shape == (3, 1, 2, 2)
    assert tensors["a"].flatten().tolist() == list(range(12))
    assert tensors["b"].tolist() == [7, 7, 7]


def test_stale_segments_of_dead_owners_are_removed(tmp_path: Path) -> None:
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{PREFIX}{dead.pid}-x"
    live = tmp_path / f"{PREFIX}{os.getpid()}-y"
    other = tmp_path / "not-ours"
    for p in (stale, live, other):
        p.write_bytes(b"0")
    assert stale_segments_remove(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_segment_owned_unlinks_on_sigterm_style_exit(tmp_path: Path) -> None:
    path = tmp_path / f"{PREFIX}{os.getpid()}-z"
    with pytest.raises(SystemExit), segment_owned(path):
        path.write_bytes(b"0")
        raise SystemExit(143)  # what training.cli's SIGTERM handler raises
    assert not path.exists()


def _model_parameters() -> list[tuple[str, torch.Tensor]]:
    from training.models.simple_cnn import SimpleCNN

    return list(SimpleCNN().named_parameters())
