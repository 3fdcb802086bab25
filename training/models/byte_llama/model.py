"""``byte-llama``: a Llama-style decoder over bytes, the plain module (how it is split over ranks
is ``parallelize.py`` beside it, as torchtitan keeps ``model/`` apart from ``infra/``).

Llama's blocks as torchtitan's ``torchtitan/models/llama3/model/model.py`` writes them, with its
module names, so that its tensor-parallel, FSDP2 and pipeline plans read the same here:
``tok_embeddings``, ``layers.N`` (``attention_norm``, ``attention.wq/wk/wv/wo``, ``ffn_norm``,
``feed_forward.w1/w2/w3``), ``norm`` and ``output``. RMSNorm before each sub-block, rotary
positions on the queries and keys, SwiGLU feed-forward, causal scaled-dot-product attention, no
biases. The vocabulary is the 256 byte values: no tokenizer to download, and bits per byte are
the loss over ln 2.

The sizes are presets (``training.catalogue.BYTE_LLAMA_SIZES``, read by the CLI and the
dashboard without torch). Attention reshapes with ``-1`` heads, as torchtitan's does, so the same
code runs on a tensor-parallel rank's share of the heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from training.text_catalogue import BYTE_VOCAB, ByteLlamaSize

ROPE_THETA = 10000.0
NORM_EPS = 1e-5
INIT_STD = 0.02  # torchtitan's and GPT-2's


def rotary_table(head_dim: int, length: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """The rotations of each position (``length`` x ``head_dim / 2``, complex64): torchtitan's
    ``precompute_freqs_cis``."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotary_apply(
    xq: torch.Tensor, xk: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys (batch, sequence, heads, head_dim) rotated by their positions."""
    q = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    rotation = table[: q.shape[1]].view(1, q.shape[1], 1, q.shape[-1])
    q_out = torch.view_as_real(q * rotation).flatten(3)
    k_out = torch.view_as_real(k * rotation).flatten(3)
    return q_out.type_as(xq), k_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, size: ByteLlamaSize) -> None:
        super().__init__()
        self.head_dim = size.dim // size.n_heads
        self.wq = nn.Linear(size.dim, size.dim, bias=False)
        self.wk = nn.Linear(size.dim, size.dim, bias=False)
        self.wv = nn.Linear(size.dim, size.dim, bias=False)
        self.wo = nn.Linear(size.dim, size.dim, bias=False)

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # -1 heads: under tensor parallel a rank holds its share of them (torchtitan's reshape).
        xq = self.wq(x).view(batch, length, -1, self.head_dim)
        xk = self.wk(x).view(batch, length, -1, self.head_dim)
        xv = self.wv(x).view(batch, length, -1, self.head_dim)
        xq, xk = rotary_apply(xq, xk, table)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, size: ByteLlamaSize) -> None:
        super().__init__()
        self.w1 = nn.Linear(size.dim, size.hidden_dim, bias=False)
        self.w2 = nn.Linear(size.hidden_dim, size.dim, bias=False)
        self.w3 = nn.Linear(size.dim, size.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, size: ByteLlamaSize, layer_id: int) -> None:
        super().__init__()
        self.attention = Attention(size)
        self.feed_forward = FeedForward(size)
        self.attention_norm = nn.RMSNorm(size.dim, eps=NORM_EPS)
        self.ffn_norm = nn.RMSNorm(size.dim, eps=NORM_EPS)
        # torchtitan's depth-scaled init of the projections back into the residual stream.
        self.out_std = INIT_STD / math.sqrt(2 * (layer_id + 1))

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), table)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        for linear in (self.attention.wq, self.attention.wk, self.attention.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=INIT_STD)
        nn.init.trunc_normal_(self.feed_forward.w1.weight, mean=0.0, std=INIT_STD)
        for linear in (self.attention.wo, self.feed_forward.w2, self.feed_forward.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=self.out_std)


class ByteLlama(nn.Module):
    """Bytes in (batch x sequence, int64 0..255), logits over the next byte out (batch x
    sequence x 256). ``layers`` is a ModuleDict keyed "0", "1", ... as torchtitan's, so that a
    pipeline stage can drop the others and keep its layers' names."""

    def __init__(self, size: ByteLlamaSize, seq_len: int) -> None:
        super().__init__()
        self.size = size
        self.seq_len = seq_len
        self.tok_embeddings = nn.Embedding(BYTE_VOCAB, size.dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(size, i) for i in range(size.n_layers)}
        )
        self.norm = nn.RMSNorm(size.dim, eps=NORM_EPS)
        self.output = nn.Linear(size.dim, BYTE_VOCAB, bias=False)
        # Not in the state dict: it follows from the size, and checkpoints hold weights only.
        self.register_buffer(
            "rotary", rotary_table(size.dim // size.n_heads, seq_len), persistent=False
        )
        self.init_weights()

    def init_weights(self) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            assert isinstance(layer, TransformerBlock)
            layer.init_weights()
        self.norm.reset_parameters()
        cutoff = 3 * self.size.dim**-0.5
        nn.init.trunc_normal_(
            self.output.weight, mean=0.0, std=self.size.dim**-0.5, a=-cutoff, b=cutoff
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rotary)
        return self.output(self.norm(h))


def flops_per_token(model: ByteLlama, seq_len: int) -> int:
    """Training FLOPs per token, torchtitan's and nanoGPT's estimate: 6 per parameter that
    multiplies (the embedding's lookup does not) for forward and backward, plus attention's
    12 x layers x heads x head_dim x sequence length."""
    size = model.size
    params = sum(p.numel() for p in model.parameters())
    multiplying = params - model.tok_embeddings.weight.numel()
    head_dim = size.dim // size.n_heads
    return 6 * multiplying + 12 * size.n_layers * size.n_heads * head_dim * seq_len
