"""Every parallel method applied to ``byte-llama`` as designed trains what one process trains at
the same global batch: DDP (its optimizer sharded too, ZeRO-1) and FSDP2 (per block, [norm,
output], root) over 2 ranks at 8 windows each, tensor parallel (torchtitan's plan, with and
without sequence parallel, the loss under loss_parallel) and the pipeline (by layer; GPipe and
1F1B) over 2 ranks sharing a batch of 16, and FSDP2 + tensor parallel over 4 ranks (pairs of
8), against single at 16: the smoke size, 4 steps of windows of 32 bytes from the Jargon File's
first 64 KiB (a text folder: its held-out tail, which every epoch evaluates whole, is 6.5 KiB, not
the whole file's 168 KiB), each epoch's sample 8 bytes, not 200 ($TRAINYARD_SAMPLE_BYTES). Under
tensor parallel and the pipeline each evaluated window and each sampled byte is a round of
collectives: the whole file's and 200 bytes took 20 s of each such run on 2 loaded cores.
The pipeline's schedules of two stages a rank (interleaved 1F1B, ZB-V's zero bubble) need 4
layers: the small size, at batches of 8.

Tolerance as tests/test_tensor_parallel.py's: the split sums (the row-wise layers' reductions,
FSDP2's reduce-scatter, the pipeline's loss summed by micro-batch) are taken in another order
than one process takes them; measured here, the losses agree to 1e-6. We require 1e-5 absolute
for losses and validation loss, 2e-4 relative to each tensor's norm for the parameters. A lost
reduction or another batch moves them by 1e-3 or more in one step.

A tensor-parallel checkpoint (gathered on rank 0) resumed under single trains the second
epoch as single did: the weights, Adam's moments and the learning-rate curve continue. The
curve's cosine spans the run's steps, so runs compare with a reference of as many epochs.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_exactness import assert_same_parameters
from tests.test_tensor_parallel import STEPS, _checkpoint, _epoch
from tests.test_tensor_parallel import _run as classifier_run
from tests.test_training import Result
from training.loop import SAMPLE_BYTES_ENV
from training.text_catalogue import JARGON_DEBIAN

TEXT_BYTES = 64 * 1024  # the Jargon File's first, in a text folder (the module's docstring)
SAMPLE = "8"

# The Jargon File comes from Debian's jargon-text, which .ci/system-packages installs.
pytestmark = pytest.mark.usefixtures("no_processes_left")
slow = pytest.mark.slow  # each torchrun run takes 10-30 s on a loaded 2-core machine


def _run(data: Path, out: Path, run_id: str, *args: str) -> Result:
    """tests/test_tensor_parallel.py's run (4 steps of seed 7, every step reported), of the
    smoke size on the text folder of ``data``."""
    language = ("--model", "byte-llama", "--model-size", "smoke", "--dataset", "textfolder",
                "--data-path", str(data / "textfolders" / "jargon"))  # fmt: skip
    return classifier_run(data, out, run_id, *language, *args)


def assert_same_epoch(ours: Result, theirs: Result, epoch: int) -> None:
    losses = [
        [e["train_loss"] for e in run.of_type("step") if e["epoch"] == epoch]
        for run in (ours, theirs)
    ]
    assert len(losses[0]) == STEPS
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    mine, reference = _epoch(ours, epoch), _epoch(theirs, epoch)
    assert mine["test_loss"] == pytest.approx(reference["test_loss"], abs=1e-5)
    assert mine["bits_per_byte"] == pytest.approx(reference["bits_per_byte"], abs=2e-5)
    assert mine["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4)
    assert_same_parameters(_checkpoint(ours, epoch), _checkpoint(theirs, epoch), rtol=2e-4)


@pytest.fixture(scope="module", autouse=True)
def short_samples() -> Iterator[None]:
    """Every run of the module samples SAMPLE bytes an epoch (the runs inherit the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SAMPLE_BYTES_ENV, SAMPLE)
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder whose text folder holds the Jargon File's first TEXT_BYTES."""
    path = tmp_path_factory.mktemp("data")
    folder = path / "textfolders" / "jargon"
    folder.mkdir(parents=True)
    text = gzip.decompress(JARGON_DEBIAN.read_bytes())[:TEXT_BYTES]
    (folder / "jargon.txt").write_bytes(text)
    return path


@pytest.fixture(scope="module")
def single(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    out = tmp_path_factory.mktemp("single")
    return _run(data, out, "single", "--strategy", "single", "--batch-size", "16")


@pytest.fixture(scope="module")
def single_two(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    """Two epochs: the reference of a run resumed at its second."""
    out = tmp_path_factory.mktemp("single-two")
    return _run(data, out, "single", "--strategy", "single", "--batch-size", "16", "--epochs", "2")


def _two_ranks(data: Path, tmp_path: Path, strategy: str, batch: int, *extra: str) -> Result:
    return _run(data, tmp_path, strategy, "--strategy", strategy, "--nproc", "2",
                "--batch-size", str(batch), *extra)  # fmt: skip


@slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp2_equal_single(
    data: Path, single: Result, tmp_path: Path, strategy: str
) -> None:
    result = _two_ranks(data, tmp_path, strategy, 8)
    assert result.started["global_batch_size"] == 16
    # The text's bytes, one copy the machine's ranks share (its segment gone: run_cli checks).
    shared = result.started["shared_tensors"]
    assert [(t["name"], t["is_shared"]) for t in shared] == [
        ("train.tokens", True),
        ("test.tokens", True),
    ]
    assert sum(t["bytes"] for t in shared) == TEXT_BYTES  # the text's, once
    assert 0 < len(_epoch(result, 1)["sample"]) <= int(SAMPLE)  # the knob reached rank 0
    assert_same_epoch(result, single, 1)
    if strategy == "fsdp":
        [note] = [n for n in result.started["notes"] if n.startswith("FSDP2")]
        assert "sharded tok_embeddings, layers.0, layers.1, [norm, output] and the root" in note
        whole = _epoch(single, 1)["memory"][0]["parameter_bytes"]
        for rank in _epoch(result, 1)["memory"]:
            assert rank["parameter_bytes"] == pytest.approx(whole / 2, rel=0.01)


@slow
def test_a_sharded_optimizer_equals_single(data: Path, single: Result, tmp_path: Path) -> None:
    """DDP with ZeroRedundancyOptimizer (--shard-optimizer): each rank steps its share of the
    parameters, the gradients clipped over the whole model first."""
    result = _two_ranks(data, tmp_path, "ddp", 8, "--shard-optimizer")
    assert any("ZeroRedundancyOptimizer" in note for note in result.started["notes"])
    assert_same_epoch(result, single, 1)


@slow
@pytest.mark.parametrize("sequence_parallel", ["--sequence-parallel", "--no-sequence-parallel"])
def test_tensor_parallel_equals_single(
    data: Path, single: Result, single_two: Result, tmp_path: Path, sequence_parallel: str
) -> None:
    resumes = sequence_parallel == "--sequence-parallel"  # the one resumed under single
    epochs = ("--epochs", "2") if resumes else ()
    result = _two_ranks(data, tmp_path, "tensor-parallel", 16, sequence_parallel, *epochs)
    reference = single_two if resumes else single
    assert result.started["global_batch_size"] == 16
    [note] = [n for n in result.started["notes"] if n.startswith("Tensor parallel")]
    assert "per block wq, wk, wv, w1, w3 column-wise and wo, w2 row-wise" in note
    assert "loss_parallel" in note
    assert ("SequenceParallel" in note) == (sequence_parallel == "--sequence-parallel")
    # Each rank holds half of every split weight: all but the norms'.
    whole = _epoch(single, 1)["memory"][0]["parameter_bytes"]
    for rank in _epoch(result, 1)["memory"]:
        assert 0.5 * whole < rank["parameter_bytes"] < 0.52 * whole
    assert_same_epoch(result, reference, 1)
    if resumes:
        resume = ("--epochs", "2", "--resume", str(_checkpoint(result, 1)))
        resumed = _run(data, tmp_path / "resumed", "resumed", "--strategy", "single",
                       "--batch-size", "16", *resume)  # fmt: skip
        assert resumed.started["start_epoch"] == 2
        assert not any("afresh" in note for note in resumed.started["notes"])
        assert_same_epoch(resumed, single_two, 2)


@slow
@pytest.mark.parametrize(("schedule", "microbatches"), [("gpipe", "2"), ("1f1b", "4")])
def test_the_pipeline_by_layer_equals_single(
    data: Path, single: Result, tmp_path: Path, schedule: str, microbatches: str
) -> None:
    result = _two_ranks(data, tmp_path, "pipeline", 16, "--pipeline-schedule", schedule,
                        "--microbatches", microbatches)  # fmt: skip
    stages = result.started["stages"]
    assert [s["children"] for s in stages] == [
        ["tok_embeddings", "layers.0"],
        ["layers.1", "norm", "output"],
    ]
    assert_same_epoch(result, single, 1)


@slow
def test_fsdp_tp_equals_single(data: Path, single: Result, tmp_path: Path) -> None:
    """The 2-D mesh (dp 2 x tp 2) needs 4 ranks: the one run here of more than 2 processes
    (about 30 s on 2 cores). Each pair trains on 8 windows, 16 a step."""
    result = _run(data, tmp_path, "fsdp-tp", "--strategy", "fsdp-tp", "--nproc", "4",
                  "--batch-size", "8")  # fmt: skip
    assert result.started["global_batch_size"] == 16
    [note] = [n for n in result.started["notes"] if n.startswith("FSDP2 + tensor parallel")]
    assert "per block wq, wk, wv, w1, w3 column-wise" in note
    assert "tok_embeddings, layers.0, layers.1, [norm, output] and the root over dp" in note
    assert_same_epoch(result, single, 1)


@pytest.fixture(scope="module")
def single_small(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Result:
    """The small size (4 layers, windows of 32): enough layers for 2 stages on each of 2 ranks."""
    out = tmp_path_factory.mktemp("single-small")
    return _run(data, out, "single", "--strategy", "single", "--model-size", "small",
                "--seq-len", "32", "--batch-size", "8")  # fmt: skip


@slow
@pytest.mark.parametrize(
    ("schedule", "owners"), [("interleaved-1f1b", [0, 1, 0, 1]), ("zero-bubble", [0, 1, 1, 0])]
)
def test_two_stages_a_rank_equal_single(
    data: Path, single_small: Result, tmp_path: Path, schedule: str, owners: list[int]
) -> None:
    """Interleaved 1F1B (looped) and ZB-V's zero bubble (in a V: rank 0 holds the first stage
    and the last), four stages of one layer on 2 ranks."""
    result = _two_ranks(data, tmp_path, "pipeline", 8, "--model-size", "small", "--seq-len",
                        "32", "--pipeline-schedule", schedule, "--microbatches", "2")  # fmt: skip
    stages = result.started["stages"]
    assert [s["device"] for s in stages] == [f"rank {r}, cpu" for r in owners]
    assert [s["children"][-1] for s in stages] == ["layers.0", "layers.1", "layers.2", "output"]
    assert_same_epoch(result, single_small, 1)
