"""``byte-llama`` and its text, without a run: torchtitan's module names, the presets, FLOPs per
token against torch's own count, the windows every strategy draws, the learning-rate curve, the
cut by layer, and the refusals the CLI and the dashboard share."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from training.data.datasets import DatasetMeta
from training.data.text import (
    TextData,
    TextSplit,
    sample_seed,
    step_seed,
    text_batches,
    text_splits,
)
from training.models.build import model_build_for
from training.models.byte_llama.model import ByteLlama, flops_per_token
from training.models.byte_llama.parallelize import stage_layers
from training.refusals import Refusal, language_refusals, pipeline_refusals
from training.strategies.schedule import lr_schedule
from training.text_catalogue import BYTE_LLAMA_SIZES, model_size_get, text_layout


def test_the_modules_have_torchtitans_names_and_no_biases() -> None:
    model = ByteLlama(model_size_get("smoke"), 32)
    names = {name for name, _ in model.named_parameters()}
    block = {
        "attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
        "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
        "attention_norm.weight", "ffn_norm.weight",
    }  # fmt: skip
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    expected |= {f"layers.{i}.{name}" for i in range(2) for name in block}
    assert names == expected  # no bias anywhere
    # Weights only: the rotary table follows from the size and is not saved.
    assert set(model.state_dict()) == expected


@pytest.mark.parametrize("name", list(BYTE_LLAMA_SIZES))
def test_each_size_builds_on_the_meta_device_with_the_parameters_it_says(name: str) -> None:
    size = BYTE_LLAMA_SIZES[name]
    with torch.device("meta"):
        model = ByteLlama(size, size.seq_len)
    count = sum(p.numel() for p in model.parameters())
    per_layer = 4 * size.dim**2 + 3 * size.dim * size.hidden_dim + 2 * size.dim
    assert count == size.n_layers * per_layer + 2 * 256 * size.dim + size.dim
    assert size.dim % size.n_heads == 0 and size.hidden_dim % size.multiple_of == 0


def test_flops_per_token_is_what_torch_counts_for_a_training_step() -> None:
    """The estimate (6 N + 12 L H Q T) against FlopCounterMode's count of a forward and
    backward's matrix multiplies, attention's included (its math kernel: the counter has no
    formula for the CPU's fused one). The estimate's N holds the norms' weights (0.4% here),
    which multiply elementwise; the counter does not count them, nor the embedding's lookup,
    which neither counts."""
    size, length, batch = model_size_get("smoke"), 32, 2
    model = ByteLlama(size, length)
    tokens = torch.randint(0, 256, (batch, length))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(tokens).sum().backward()
    counted = counter.get_total_flops() / (batch * length)
    assert counted == pytest.approx(flops_per_token(model, length), rel=0.01)


def test_the_built_model_says_its_size_window_and_flops() -> None:
    meta = DatasetMeta("jargon", 256, 0, 0)
    built = model_build_for(name="byte-llama", meta=meta, model_size="smoke", seq_len=64)
    info = built.info
    assert (info["model_size"], info["seq_len"], info["num_classes"]) == ("smoke", 64, 256)
    assert info["flops_per_token"] == flops_per_token(built.model, 64)  # type: ignore[arg-type]
    assert "2 layers of width 32" in built.notes[0]


def _text(n: int = 5000) -> TextSplit:
    data = bytes(range(256)) * (n // 256 + 1)
    train, _ = text_splits(TextData(data[:n], data[:100], "test", ()), 16)
    return train


def test_a_window_predicts_each_next_byte() -> None:
    split = _text()
    x, y = split.windows(torch.tensor([0, 300]))
    assert x.shape == y.shape == (2, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert x[1, 0] == 300 % 256


def test_every_data_parallel_split_of_a_step_draws_the_same_global_batch() -> None:
    """Two ranks' slices at batch 8 are one process's batch of 16, step by step, and a step's
    windows depend on seed and step alone (a resumed run draws them again)."""
    split = _text()
    common = {"seed": 3, "first_step": 5, "steps": 3}
    whole = text_batches(split, batch_size=16, count=1, rank=0, **common)
    halves = [text_batches(split, batch_size=8, count=2, rank=r, **common) for r in (0, 1)]
    for step, batch in enumerate(whole):
        assert torch.equal(batch, torch.cat([halves[0][step], halves[1][step]]))
    later = text_batches(split, batch_size=16, count=1, rank=0, seed=3, first_step=6, steps=1)
    assert torch.equal(later[0], whole[1])
    other = text_batches(split, batch_size=16, count=1, rank=0, seed=4, first_step=5, steps=1)
    assert not torch.equal(other[0], whole[0])
    assert int(max(b.max() for b in whole)) <= split.starts


def test_no_two_seeds_and_epochs_write_with_one_generator() -> None:
    """The sample after each epoch draws from its own generator: seed 1 after epoch 2 and seed
    2 after epoch 1 write apart (``seed + epoch`` had them write one text), and no sample's
    generator is a step's windows'."""
    pairs = [(seed, epoch) for seed in range(40) for epoch in range(1, 41)]
    seeds = {sample_seed(seed, epoch) for seed, epoch in pairs}
    assert len(seeds) == len(pairs)
    assert sample_seed(1, 2) != sample_seed(2, 1)
    assert not seeds & {step_seed(seed, step) for seed, step in pairs}
    assert all(0 <= s < 2**32 for s in seeds)  # torch's CPU generator keeps 32 bits


def test_a_split_shorter_than_a_window_is_refused() -> None:
    from training.data.images import DataRefused

    with pytest.raises(DataRefused, match="fewer than one window of --seq-len 16"):
        text_splits(TextData(b"x" * 100, b"short", "test", ()), 16)


def test_the_learning_rate_warms_up_then_falls_on_a_cosine_to_a_tenth() -> None:
    schedule = lr_schedule(1e-3, 100)
    assert schedule.warmup == 5
    rates = [schedule.at(step) for step in range(1, 101)]
    assert rates[0] == pytest.approx(2e-4) and rates[4] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[4:], rates[5:], strict=False))
    assert rates[-1] == pytest.approx(1e-4)
    halfway = 1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 47 / 95))
    assert schedule.at(5 + 47) == pytest.approx(halfway)


def test_the_pipeline_cuts_by_layer_as_evenly_as_it_goes() -> None:
    assert stage_layers(4, 2) == [[0, 1], [2, 3]]
    assert stage_layers(5, 3) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError):
        stage_layers(2, 3)


def test_a_language_model_and_text_go_together() -> None:
    (refusal,) = language_refusals("single", model="byte-llama", dataset="mnist", processes=1)
    assert refusal.field == "dataset" and "trains on text (jargon or textfolder)" in refusal.message
    (refusal,) = language_refusals("single", model="simple-cnn", dataset="jargon", processes=1)
    assert refusal.field == "model" and "--model byte-llama" in refusal.cli_message
    assert language_refusals("single", model="simple-cnn", dataset="mnist", processes=1) == []
    (refusal,) = language_refusals("hogwild", model="byte-llama", dataset="jargon", processes=2)
    assert "does not train language models" in refusal.message
    assert language_refusals("deepspeed", model="byte-llama", dataset="jargon", processes=2) == []


def test_tensor_parallel_degrees_must_divide_heads_vocabulary_and_window() -> None:
    def fields(processes: int, **kw: object) -> list[str]:
        found = language_refusals(
            "tensor-parallel", model="byte-llama", dataset="jargon", processes=processes, **kw
        )  # type: ignore[arg-type]
        return [r.field for r in found]

    assert fields(2) == [] and fields(4) == []
    # small: 4 heads, 256 byte values, SwiGLU 352, window 128; 3 divides none of them.
    assert fields(3) == ["processes", "processes", "processes", "seq_len"]
    assert fields(3, sequence_parallel=False) == ["processes"] * 3
    (refusal,) = language_refusals(
        "tensor-parallel", model="byte-llama", dataset="jargon", processes=2, seq_len=33
    )
    assert refusal.cli_message.startswith("argument --seq-len:")
    assert "window (--seq-len), 33, is not a multiple of 2" in refusal.cli_message
    # 8 ranks: more than the small size's 4 heads.
    (refusal,) = language_refusals(
        "tensor-parallel", model="byte-llama", dataset="jargon", processes=8
    )
    assert "number of heads, 4, is not a multiple of 8" in refusal.message
    # fsdp-tp's tensor dimension is 2 whatever --nproc.
    assert language_refusals("fsdp-tp", model="byte-llama", dataset="jargon", processes=6) == []


def test_the_pipeline_refuses_more_stages_than_layers_and_fewer_microbatches_than_stages() -> None:
    common = {"batch_size": 8, "schedule": "gpipe", "stages": 4, "language": True}
    (refusal,) = pipeline_refusals("pipeline", processes=5, microbatches=8, **common)  # type: ignore[arg-type]
    assert "more stages than layers" in refusal.cli_message
    (refusal,) = pipeline_refusals("pipeline", processes=4, microbatches=2, **common)  # type: ignore[arg-type]
    assert "fewer than the 4 stages" in refusal.cli_message
    assert pipeline_refusals("pipeline", processes=4, microbatches=4, **common) == []  # type: ignore[arg-type]


def test_schedules_of_two_stages_a_rank_refuse_rounds_torch_cannot_run() -> None:
    """torch's ScheduleInterleaved1F1B and ScheduleZBVZeroBubble run the micro-batches in
    max(1, M // ranks) rounds and raise (on every rank, after the start) unless the rounds
    divide M: 5 on 2 ranks makes 2 rounds of 2.5. Refused up front, with the fix."""

    def refusals(schedule: str, microbatches: int) -> list[Refusal]:
        return pipeline_refusals(
            "pipeline", processes=2, batch_size=120, microbatches=microbatches,
            schedule=schedule, stages=4, language=True,
        )  # fmt: skip

    for schedule in ("interleaved-1f1b", "zero-bubble"):
        (refusal,) = refusals(schedule, 5)
        assert refusal.field == "microbatches"
        assert "5 micro-batches make 2 rounds" in refusal.message
        assert "a multiple of 2, or fewer than 4" in refusal.message
        assert refusal.cli_message.startswith("argument --microbatches:")
        for fine in (2, 3, 4, 8, 10):  # one round, or rounds that divide them
            assert refusals(schedule, fine) == []
    # GPipe and 1F1B run every micro-batch in one round: any count at least the stages.
    assert refusals("1f1b", 5) == []


def test_a_text_folder_reads_only_its_own_files_not_where_links_lead(tmp_path: Path) -> None:
    """The CLI checks that --data-path lies under the text roots; a link inside the folder
    (a train/ that points elsewhere, a .txt that names another file) would read past them, as
    the worker's user, into a model whose text the run page shows. Such files are not the
    folder's: left out, and a folder with nothing else holds no text."""
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "secret.txt").write_text("the worker's secret " * 20)
    folder = tmp_path / "textfolders" / "notes"
    folder.mkdir(parents=True)
    (folder / "mine.txt").write_text("my own words " * 20)
    (folder / "leak.txt").symlink_to(outside / "secret.txt")
    (folder / "more").symlink_to(outside, target_is_directory=True)  # os.walk does not follow
    layout = text_layout(folder)
    assert layout is not None
    assert [Path(f).name for f in layout.train] == ["mine.txt"]
    assert layout.bytes == len("my own words " * 20)
    # train/ and val/ that lead outside: nothing of the folder's own to train on.
    split = tmp_path / "textfolders" / "split"
    split.mkdir()
    (split / "train").symlink_to(outside, target_is_directory=True)
    (split / "val").mkdir()
    (split / "val" / "v.txt").write_text("held out " * 20)
    assert text_layout(split) is None
    # A link that stays inside the folder is its own file.
    (folder / "again.txt").symlink_to(folder / "mine.txt")
    again = text_layout(folder)
    assert again is not None and [Path(f).name for f in again.train] == ["again.txt", "mine.txt"]


def test_windows_are_drawn_only_where_a_whole_window_fits() -> None:
    """A window is seq_len + 1 bytes, so a split of N bytes has N - seq_len offsets (``starts``):
    0 to N - seq_len - 1. A draw of the one past them read past the text's end (IndexError,
    the run failed): rare on the Jargon File, likely within a run on a small text folder."""
    split = TextSplit(torch.arange(40, dtype=torch.uint8), 32)
    assert split.starts == 8
    batches = text_batches(split, batch_size=64, count=1, rank=0, seed=0, first_step=1, steps=20)
    drawn = torch.cat(batches)
    assert set(drawn.tolist()) == set(range(8))  # every offset that fits, and only those
    inputs, targets = split.windows(drawn)
    assert int(targets[:, -1].max()) == 39  # the last byte, predicted
