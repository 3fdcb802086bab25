"""A plug-in's own language model: a package whose ``trainyard.models`` entry point's build declares
``language = True`` and its tensor-parallel plan, torchtitan's kind (module path -> style, an
output that leaves the logits split by vocabulary for ``loss_parallel``). It is listed among the
language models, trains on the Jargon File, and tensor parallel over 2 ranks, splitting it by
the plug-in's plan (not byte-llama's), trains what one process trains: 3 steps of batches of 4
windows of 32 bytes, within tests/test_lm_exactness.py's tolerance.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.plugin_package import plugin_package_write
from tests.test_lm_deepspeed import assert_same_training, lm_run
from tests.test_training import run_cli

STEPS = 3
COMMON = (
    *("--model", "tiny-lm", "--dataset", "jargon", "--seq-len", "32", "--batch-size", "4"),
    *("--seed", "7", "--steps-per-epoch", str(STEPS), "--log-interval", "1"),
)

PLUGIN = '''
"""A language model of the user's own over bytes, in parts run one after another (its pipeline
cut), found by its entry point."""
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel


class Embed(nn.Module):
    def __init__(self, vocab_size, seq_len, dim):
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, dim)
        self.position = nn.Parameter(torch.randn(seq_len, dim) * 0.02)

    def forward(self, tokens):
        return self.tokens(tokens) + self.position[: tokens.shape[1]]


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w2 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, h):
        b, t, _ = h.shape
        x = self.norm1(h)
        # -1 heads: under tensor parallel each rank holds its share of them.
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.wo(a.transpose(1, 2).reshape(b, t, -1))
        return h + self.w2(F.gelu(self.w1(self.norm2(h))))


class Head(nn.Module):
    def __init__(self, dim, vocab_size):
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, h):
        return self.output(self.norm(h))


class TinyLM(nn.Module):
    def __init__(self, vocab_size, seq_len, dim=32, heads=4):
        super().__init__()
        self.embed = Embed(vocab_size, seq_len, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(2)])
        self.head = Head(dim, vocab_size)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def build(*, vocab_size, seq_len):
    return TinyLM(vocab_size, seq_len)


def tensor_parallel(model):
    plan = {"head.output": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(len(model.blocks)):
        for name, style in (("wq", "colwise"), ("wk", "colwise"), ("wv", "colwise"),
                            ("wo", "rowwise"), ("w1", "colwise"), ("w2", "rowwise")):
            plan[f"blocks.{i}.{name}"] = style
    return plan


build.language = True
build.seq_len = 32
build.tensor_parallel = tensor_parallel
build.stages = lambda model: [
    ("embed", model.embed), ("blocks.0", model.blocks[0]), ("blocks.1", model.blocks[1]),
    ("head", model.head),
]


def build_whole(*, vocab_size, seq_len):  # declares no plan and no cut
    return TinyLM(vocab_size, seq_len)


build_whole.language = True
'''

pytestmark = pytest.mark.usefixtures("no_processes_left")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package as pip would install it, on the runs' PYTHONPATH (run_cli passes ours on)."""
    root = plugin_package_write(
        tmp_path / "plugin", module="tinylm", source=PLUGIN, group="trainyard.models",
        entry_points={"tiny-lm": "tinylm:build", "tiny-lm-whole": "tinylm:build_whole"},
    )  # fmt: skip
    paths = [str(Path.cwd()), str(root), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_plugin_language_model_is_listed_and_refused_byte_llamas_options(
    plugin: Path, tmp_path: Path
) -> None:
    from training.catalogue import catalogue_collect, model_language
    from training.refusals import language_refusals

    assert model_language("tiny-lm") and not model_language("simple-cnn")
    listed = catalogue_collect(data_dir=tmp_path)
    assert listed["language_models"] == ["byte-llama", "tiny-lm", "tiny-lm-whole"]
    assert "tiny-lm" in listed["models_tensor_parallel"]
    assert "tiny-lm-whole" not in listed["models_tensor_parallel"]
    (refusal,) = language_refusals("single", model="tiny-lm", dataset="mnist", processes=1)
    assert "tiny-lm is a language model: it trains on text" in refusal.message
    assert language_refusals("pipeline", model="tiny-lm", dataset="jargon", processes=2) == []
    whole = language_refusals("pipeline", model="tiny-lm-whole", dataset="jargon", processes=2)
    assert "the plug-in language model tiny-lm-whole declares no cut" in whole[0].message
    sized = run_cli(tmp_path, *COMMON, "--model-size", "smoke")
    assert sized.returncode == 2
    assert "tiny-lm has its own size and tensor-parallel plan" in sized.stderr


def test_a_worker_counts_a_plugin_language_models_parts(plugin: Path, tmp_path: Path) -> None:
    """The worker's report counts a plug-in language model's stages for the dashboard's launch
    checks (dashboard.devices.facts): its declared parts, built for windows of bytes."""
    from dashboard.devices.facts import plugin_stages_count
    from training.catalogue import catalogue_collect

    assert plugin_stages_count(catalogue_collect(data_dir=tmp_path)) == {"tiny-lm": 4}


@pytest.mark.slow
def test_tensor_parallel_and_the_pipeline_split_it_by_its_own_plan_and_equal_single(
    plugin: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    single = lm_run(data, tmp_path / "single", *COMMON, "--strategy", "single")
    info = single.started["model_info"]
    assert (info["source"], info["seq_len"]) == ("plug-in tinylm", 32)
    split = lm_run(data, tmp_path / "tp", *COMMON, "--strategy", "tensor-parallel", "--nproc", "2")
    [note] = [n for n in split.started["notes"] if n.startswith("Tensor parallel")]
    assert "its plug-in's plan: head.output ColwiseParallel, blocks.0.wq ColwiseParallel" in note
    # Split indeed: the plan's layers hold 32,768 of the model's 42,144 parameters, half a rank.
    assert "each rank holds 103,040 of 168,576 parameter bytes (61%)" in note
    assert_same_training(split, single, STEPS)
    piped = lm_run(data, tmp_path / "pp", *COMMON, "--strategy", "pipeline", "--nproc", "2",
                   "--microbatches", "2")  # fmt: skip
    assert [s["children"] for s in piped.started["stages"]] == [
        ["embed", "blocks.0"],
        ["blocks.1", "head"],
    ]
    assert_same_training(piped, single, STEPS)
