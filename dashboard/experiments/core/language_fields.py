"""A language model's launch fields (byte-llama, training/text_catalogue.py): its size preset,
its window in bytes and tensor parallel's split by sequence, as the launch form (and through it
the JSON API and every cell of a study) takes and judges them.

The engine's facts decide: the sizes and their defaults are text_catalogue's, the refusals
training.refusals' (``language_refusals``: a language model on text and only there, the
strategies that train one, the widths a tensor-parallel degree must divide; the pipeline's
stages are the size's layers), so a launch is refused here for what the CLI would refuse, with
the same reason. A run stores what it trains with: a blank size or window becomes the size's
default, sequence parallel its default where tensor parallel splits the model, and all three
are emptied for the other models (the page keeps their fields, hidden, as the user switches
models; the API refuses them there, api_launch.py).

A plug-in's language model is installed on the workers alone: this server knows it as one from
their reports (``language_models``), and hands that to the engine's refusals. It has its own
size and plan, so its run stores its window only (blank: its build's).
"""

from __future__ import annotations

from typing import Any, Final

from django import forms

from dashboard.devices.catalogue import language_models_online
from dashboard.experiments.core.catalogue_checks import splittable_reported
from training.refusals import language_refusals
from training.registry import TENSOR_PARALLEL_STRATEGIES, StrategySpec
from training.text_catalogue import (
    BYTE_LLAMA,
    BYTE_LLAMA_SIZE_DEFAULT,
    BYTE_LLAMA_SIZES,
    LANGUAGE_MODELS,
    SEQ_LEN_BOUNDS,
    TEXT_DATASETS,
)

LANGUAGE_FIELDS: Final = ("model_size", "seq_len", "sequence_parallel")
SEQUENCE_PARALLEL_DEFAULT: Final = True


def sizes_text() -> str:
    return ", ".join(BYTE_LLAMA_SIZES)


def model_size_field() -> forms.ChoiceField:
    """The size's select: "default (small)" first, then each preset of byte-llama."""
    field = forms.ChoiceField(
        required=False,
        label="Size",
        choices=[("", f"default ({BYTE_LLAMA_SIZE_DEFAULT})")]
        + [(size.name, size.name) for size in BYTE_LLAMA_SIZES.values()],
        help_text=f"{BYTE_LLAMA}'s size preset; the window's default is the size's.",
    )
    field.error_messages["invalid_choice"] = (
        f"%(value)s is not a size of {BYTE_LLAMA}; its sizes are {sizes_text()}"
    )
    return field


def seq_len_help() -> str:
    """The window field's line: what it is, and each size's default."""
    defaults = ", ".join(f"{s.seq_len} for {s.name}" for s in BYTE_LLAMA_SIZES.values())
    return (
        f"Bytes the model reads at once, its training windows (from {SEQ_LEN_BOUNDS[0]} to "
        f"{SEQ_LEN_BOUNDS[1]:,}); empty: the size's ({defaults}). Batch size counts windows."
    )


def sequence_parallel_field() -> forms.NullBooleanField:
    """Tensor parallel's split by sequence: the default (on), on or off; null is the default."""
    return forms.NullBooleanField(
        required=False,
        label="Sequence parallel",
        widget=forms.Select(choices=[("", "default (on)"), ("true", "on"), ("false", "off")]),
        help_text="Tensor parallel also splits the norms and the residual stream by sequence "
        "(torchtitan's plan); each rank then takes an equal share of a window's bytes.",
    )


def language_facts() -> dict[str, Any]:
    """What the launch form's script needs (the page's JSON): which models are language
    models (a plug-in's as the workers report it), which of them have byte-llama's sizes and
    sequence parallel, and each size's window and line of help."""
    return {
        "language_models": language_models_online(),
        "sized": list(LANGUAGE_MODELS),
        "sizes": {
            size.name: {"seq_len": size.seq_len, "help": size.help}
            for size in BYTE_LLAMA_SIZES.values()
        },
        "size_default": BYTE_LLAMA_SIZE_DEFAULT,
        "tensor_parallel": list(TENSOR_PARALLEL_STRATEGIES),
    }


def language_clean(
    data: dict[str, Any], *, spec: StrategySpec, model: str
) -> list[tuple[str, str]]:
    """``data``'s language fields as the run trains with them, and the refusals as
    (field, message): see the module docstring."""
    language = model in language_models_online()
    refusals: list[tuple[str, str]] = []
    if not language:
        data.update(model_size="", seq_len=None, sequence_parallel=None)
    elif model in LANGUAGE_MODELS:  # a plug-in's keeps its own size and plan (refused below)
        refusals += _byte_llama_clean(data, spec=spec)
    found = language_refusals(
        spec.name, model=model, dataset=data.get("dataset") or "",
        processes=data.get("processes") or 1, model_size=data.get("model_size") or None,
        seq_len=data.get("seq_len"), sequence_parallel=data.get("sequence_parallel"),
        language=language, splittable=splittable_reported(model=model) if language else None,
    )  # fmt: skip
    return refusals + [(refusal.field, refusal.message) for refusal in found]


def _byte_llama_clean(data: dict[str, Any], *, spec: StrategySpec) -> list[tuple[str, str]]:
    size = BYTE_LLAMA_SIZES[data.get("model_size") or BYTE_LLAMA_SIZE_DEFAULT]
    data["model_size"], data["seq_len"] = size.name, data.get("seq_len") or size.seq_len
    given = data.get("sequence_parallel")
    if spec.name in TENSOR_PARALLEL_STRATEGIES:
        data["sequence_parallel"] = SEQUENCE_PARALLEL_DEFAULT if given is None else given
    elif why := sequence_parallel_not_read(spec.name, given):
        return [("sequence_parallel", why)]
    else:
        data["sequence_parallel"] = None
    return []


def run_language(*, model: str, dataset: str) -> bool:
    """Whether a stored run trains a language model: byte-llama, or a model on text (the launch
    checks paired text with a language model alone, a plug-in's as its workers reported it)."""
    return model in LANGUAGE_MODELS or dataset in TEXT_DATASETS


def sequence_parallel_not_read(strategy: str, value: Any) -> str:
    """Why ``value`` is refused for ``strategy`` ("" where it is not): only tensor parallel
    reads it, and its default is dropped elsewhere (as a strategy option's is)."""
    if strategy in TENSOR_PARALLEL_STRATEGIES or value in (None, SEQUENCE_PARALLEL_DEFAULT):
        return ""
    return (
        f"sequence parallel applies to tensor parallel ({', '.join(TENSOR_PARALLEL_STRATEGIES)}) "
        f"only, not {strategy}"
    )


def stage_count(data: dict[str, Any], *, model: str) -> int | None:
    """The most stages a language model's pipeline cuts into: its size's layers (None for the
    other models, whose limit catalogue_checks counts)."""
    if model not in LANGUAGE_MODELS:
        return None
    size = BYTE_LLAMA_SIZES.get(data.get("model_size") or BYTE_LLAMA_SIZE_DEFAULT)
    return size.n_layers if size else None


def language_not_read(payload: dict[str, Any], *, model: str, strategy: str) -> dict[str, str]:
    """The language fields a request gives (not null, not blank) that its run would not read,
    with why: every one for a model that is no language model, sequence parallel off for a
    strategy that is no tensor parallel. The API refuses them; a study skips such a cell."""
    language = language_models_online()
    if model in language:
        why = sequence_parallel_not_read(strategy, payload.get("sequence_parallel"))
        return {"sequence_parallel": why} if why else {}
    why = f"only a language model reads it ({', '.join(language)}), not {model}"
    return {name: why for name in LANGUAGE_FIELDS if payload.get(name) not in (None, "")}
