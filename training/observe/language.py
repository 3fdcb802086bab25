"""A language model's figures, added to the step and epoch events the meter makes
(``observe.meter.report_from_rows``): what language-model users read in torchtitan's and
nanoGPT's logs.

- ``tokens_per_second``: the windows a second x the window's bytes, all ranks (a token counted
  once where a tensor-parallel group trains on it together) and per rank;
- ``grad_norm``: the last step's gradient norm before clipping (``strategies.clipping``);
- ``mfu``: tokens/s x FLOPs per token over the run's peak (``observe.peak``);
- at evaluation, ``bits_per_byte`` (the validation loss in bits: the loss over ln 2, bytes being
  the tokens), ``perplexity`` (e to the loss) and ``sample``, the text the model writes.
"""

from __future__ import annotations

import math
from typing import Any

from training.observe.peak import Peak


def tokens_fields(
    report: dict[str, Any], *, seq_len: int, peak: Peak | None, flops_per_token: int
) -> dict[str, Any]:
    """``report`` (a step's or an epoch's) with tokens/s, per rank too, and MFU."""
    tokens = round(report["images_per_second"] * seq_len, 1)
    ranks = [
        {**rank, "tokens_per_second": round(rank["images_per_second"] * seq_len, 1)}
        for rank in report.get("ranks", [])
    ]
    fields = {**report, "tokens_per_second": tokens, "ranks": ranks}
    if peak is not None:
        fields["mfu"] = peak.mfu(tokens, flops_per_token)
    return fields


def test_fields(test_loss: float | None, sample: str) -> dict[str, Any]:
    """An evaluation's figures in a language model's words."""
    if test_loss is None:  # diverged: no finite loss to say it in
        return {"bits_per_byte": None, "perplexity": None, "sample": sample}
    return {
        "bits_per_byte": round(test_loss / math.log(2), 6),
        "perplexity": round(math.exp(min(test_loss, 700.0)), 6),
        "sample": sample,
    }
