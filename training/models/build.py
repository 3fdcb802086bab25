"""Build any model of the catalogue (``training.catalogue``) for a dataset, and say how it was
adapted to it.

``model_build_for`` is the one way a run gets its model, whatever the strategy:

- ``simple-cnn``, the built-in (``models.simple_cnn``), made for the dataset's classes, channels
  and image size;
- ``byte-llama``, the built-in language model (``models.byte_llama``), at its ``--model-size``
  for windows of ``--seq-len`` bytes;
- a torchvision classifier, ``get_model(name, weights=None, num_classes=...)``, its first
  ``Conv2d`` (in module order) replaced by one that takes the dataset's channels;
- a plug-in: the entry point of group ``trainyard.models`` called ``name``, whose object is
  ``build(*, num_classes, in_channels, image_size)``; it adapts itself.

Then one forward at the dataset's image size (no grad, eval mode, a batch of one) tells whether
the model takes it. Where it does not (inception_v3 wants at least 75x75), a builder that takes
``image_size`` (ViT) is built for the smallest size it takes, else the smallest size the model
as built takes is looked for; either way a parameter-free forward pre-hook (``InputResize``)
resizes each batch to it, and the notes say so. The hook sits on that model alone: its state dict
and every other model's are unchanged. A model that takes none of the sizes tried is refused
with the error of the dataset's size.

``model_stages`` gives a model's parts for ``model-parallel`` and ``pipeline``: a plug-in's own
``build.stages(model)``, else the model's top-level children. ``model_tensor_plan`` gives the
linear layers ``tensor-parallel`` and ``fsdp-tp`` split, as the model declares them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training import catalogue
from training.data.datasets import DatasetMeta
from training.models.byte_llama.model import ByteLlama, flops_per_token
from training.models.language_plugin import language_plugin_build
from training.models.simple_cnn import SimpleCNN
from training.protocol import ModelInfo
from training.text_catalogue import BYTE_VOCAB, LANGUAGE_MODELS, model_size_get

# Sizes tried, smallest first, where a model does not take the dataset's: common input sizes,
# and the minimum of the models that have one (inception_v3: 75, alexnet: 63 rounds up to 64).
PROBE_SIZES = (32, 48, 64, 75, 96, 112, 128, 160, 192, 224, 256, 299, 320, 384, 448, 512)
# torchvision builders with an auxiliary classifier, whose training-mode output is a tuple the
# loss cannot take: built without it (their weights=None default would also warn about init).
AUX_LOGITS_OFF = {"googlenet": {"aux_logits": False, "init_weights": True},
                  "inception_v3": {"aux_logits": False, "init_weights": True}}  # fmt: skip

Part = tuple[str, nn.Module]  # a named part of a model: a top-level child, or a declared stage


class ModelRefused(ValueError):
    """The model cannot be built or trained for this dataset; the message says why."""


@dataclass(frozen=True)
class BuiltModel:
    model: nn.Module
    info: ModelInfo  # started.model_info
    notes: list[str]  # how it was adapted, for started.notes


@dataclass(frozen=True)
class InputResize:
    """A forward pre-hook that resizes the images to ``size`` x ``size`` (bilinear): the input
    stage of a model that does not take the dataset's size. Module-level and a plain value, so
    that a model carrying it pickles (Hogwild's spawned processes)."""

    size: int

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x, *rest = args
        if x.shape[-2:] != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return (x, *rest)


def model_build_for(
    *,
    name: str,
    meta: DatasetMeta,
    weights: str | None = None,
    model_size: str | None = None,
    seq_len: int | None = None,
) -> BuiltModel:
    """``name`` built for ``meta``'s dataset (weights from ``weights``, a local state-dict file,
    where given); a language model at ``model_size`` for windows of ``seq_len``. Seed the RNG
    first: the initial weights come from it."""
    if name in LANGUAGE_MODELS or (seq_len is not None and catalogue.model_language(name)):
        return _language_model_build(name, model_size, seq_len, weights)
    entry = _entry(name)
    model: nn.Module
    if entry.source == "built in":
        model = SimpleCNN(meta.classes, meta.channels, meta.image_size)
        notes = [f"{name}: {_channels(meta.channels)}, {meta.classes} classes, "
                 f"{meta.image_size}x{meta.image_size} images"]  # fmt: skip
        size = _size_checked(name, model, meta)
    elif entry.source == "torchvision":
        model, size, notes = _torchvision_build(name, meta)
    else:
        model = _plugin_build(name, meta)
        notes = [f"{name}: built by its plug-in ({entry.source[len('plug-in ') :]}) for "
                 f"{_channels(meta.channels)}, {meta.classes} classes"]  # fmt: skip
        size = _size_checked(name, model, meta)
    if weights:
        notes.append(weights_load(model, Path(weights), name=name))
    info: ModelInfo = {
        "name": name,
        "source": entry.source,
        "parameters": sum(p.numel() for p in model.parameters()),
        "in_channels": meta.channels,
        "num_classes": meta.classes,
        "image_size": meta.image_size,
        "input_size": size,
    }
    return BuiltModel(model, info, notes)


def _language_model_build(
    name: str, model_size: str | None, seq_len: int | None, weights: str | None
) -> BuiltModel:
    if name not in LANGUAGE_MODELS:
        return _language_plugin_build(name, seq_len, weights)
    size = model_size_get(model_size)
    length = seq_len or size.seq_len
    model = ByteLlama(size, length)
    parameters = sum(p.numel() for p in model.parameters())
    notes = [
        f"{name} ({size.name}): {size.n_layers} layers of width {size.dim}, {size.n_heads} "
        f"heads, SwiGLU width {size.hidden_dim}, {parameters:,} parameters; windows of "
        f"{length} bytes (vocabulary: the 256 byte values)."
    ]
    if weights:
        notes.append(weights_load(model, Path(weights), name=name))
    info: ModelInfo = {
        "name": name, "source": "built in", "parameters": parameters, "in_channels": 0,
        "num_classes": model.output.out_features, "image_size": 0, "input_size": length,
        "model_size": size.name, "seq_len": length,
        "flops_per_token": flops_per_token(model, length),
    }  # fmt: skip
    return BuiltModel(model, info, notes)


def _language_plugin_build(name: str, seq_len: int | None, weights: str | None) -> BuiltModel:
    """A plug-in's language model (``models.language_plugin``). Its FLOPs per token are the
    6N of its parameters alone: its attention's share depends on a shape it does not declare."""
    length = seq_len or catalogue.language_plugin_window(name)
    model = language_plugin_build(name, length)
    parameters = sum(p.numel() for p in model.parameters())
    source = catalogue.plugin_source(name)
    notes = [
        f"{name}: a language model built by its plug-in ({source[len('plug-in ') :]}), "
        f"{parameters:,} parameters; windows of {length} bytes (vocabulary: the 256 byte "
        "values). Its FLOPs per token are counted as 6N (the parameters'), without attention's."
    ]
    if weights:
        notes.append(weights_load(model, Path(weights), name=name))
    info: ModelInfo = {
        "name": name, "source": source, "parameters": parameters, "in_channels": 0,
        "num_classes": BYTE_VOCAB, "image_size": 0, "input_size": length, "seq_len": length,
        "flops_per_token": 6 * parameters,
    }  # fmt: skip
    return BuiltModel(model, info, notes)


def _entry(name: str) -> catalogue.ModelEntry:
    if name in catalogue.BUILTIN_MODELS:
        # Known without listing torchvision's (importing torchvision costs about 1 CPU-s in every
        # process of a run: training.data.idx_files); the built-in's name is never a plug-in's.
        return catalogue.ModelEntry(name, "built in")
    entries = {entry.name: entry for entry in catalogue.model_entries()}
    entry = entries.get(name)
    if entry is None:
        raise ModelRefused(catalogue.unknown_model_message(name, list(entries)))
    return entry


# --- torchvision ---------------------------------------------------------------------------


def _torchvision_build(name: str, meta: DatasetMeta) -> tuple[nn.Module, int, list[str]]:
    """The torchvision model for ``meta``, the size it is fed, and the notes that say how."""
    rng = torch.get_rng_state()  # every attempt starts from the seed: the weights do not
    # depend on how many attempts came before
    model = _torchvision_adapted(name, meta, {}, rng)
    notes = [_first_conv_note(name, model, meta)]
    if AUX_LOGITS_OFF.get(name):
        notes.append(f"{name}: built without its auxiliary classifier (aux_logits=False).")
    failure = probe(model, meta.channels, meta.image_size, meta.classes)
    if failure is None:
        return model, meta.image_size, notes
    for size in _sizes_above(meta.image_size):
        # A builder that takes image_size (ViT) is built for the smallest size it takes.
        try:
            sized = _torchvision_adapted(name, meta, {"image_size": size}, rng)
        except TypeError:
            break  # the builder has no image_size
        except (ValueError, AssertionError, RuntimeError):
            continue  # not this size (ViT: a multiple of its patch size)
        if probe(sized, meta.channels, size, meta.classes) is None:
            notes.append(_resize_note(name, meta.image_size, size, built_for=True))
            return _resized(sized, size), size, notes
    for size in _sizes_above(meta.image_size):
        if probe(model, meta.channels, size, meta.classes) is None:
            notes.append(_resize_note(name, meta.image_size, size, built_for=False))
            return _resized(model, size), size, notes
    raise ModelRefused(
        f"{name} does not take {meta.image_size}x{meta.image_size} images, nor any size up to "
        f"{PROBE_SIZES[-1]}x{PROBE_SIZES[-1]}: {failure}"
    )


def _torchvision_adapted(
    name: str, meta: DatasetMeta, extra: dict[str, Any], rng: torch.Tensor
) -> nn.Module:
    from torchvision import models

    torch.set_rng_state(rng)
    kwargs = {**AUX_LOGITS_OFF.get(name, {}), **extra}
    model: nn.Module = models.get_model(name, weights=None, num_classes=meta.classes, **kwargs)
    first_conv_adapt(model, meta.channels, name=name)
    return model


def first_conv_adapt(model: nn.Module, channels: int, *, name: str) -> None:
    """Replace the first ``Conv2d`` (module order) by one that takes ``channels``; its weights
    are the original's, input channel ``i`` taken from channel ``i % original``, so the model's
    own initialisation is kept."""
    found = next(_convs(model), None)
    if found is None:
        raise ModelRefused(f"{name} has no Conv2d whose input channels could follow the dataset's")
    path, conv = found
    if conv.in_channels == channels:
        return
    if conv.groups != 1:
        raise ModelRefused(
            f"{name}'s first convolution ({path}) is grouped ({conv.groups} groups); it cannot "
            f"be made to take {_channels(channels)}"
        )
    shape: dict[str, Any] = {
        "kernel_size": conv.kernel_size, "stride": conv.stride, "padding": conv.padding,
        "dilation": conv.dilation, "bias": conv.bias is not None,
        "padding_mode": conv.padding_mode,
    }  # fmt: skip
    new = nn.Conv2d(channels, conv.out_channels, **shape)
    with torch.no_grad():
        new.weight.copy_(conv.weight[:, [i % conv.in_channels for i in range(channels)]])
        if conv.bias is not None and new.bias is not None:
            new.bias.copy_(conv.bias)
    parent, _, attr = path.rpartition(".")
    setattr(model.get_submodule(parent), attr, new)
    new.trainyard_was_channels = conv.in_channels  # type: ignore[assignment]  # for the note


def _convs(model: nn.Module) -> Iterator[tuple[str, nn.Conv2d]]:
    for path, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            yield path, module


def _first_conv_note(name: str, model: nn.Module, meta: DatasetMeta) -> str:
    """ "resnet18: first convolution takes 1 channel, 10 classes (conv1 was built for 3)"."""
    path, conv = next(_convs(model))
    was = getattr(conv, "trainyard_was_channels", None)
    how = f"{path} was built for {was}" if was is not None else f"{path}, as built"
    return (
        f"{name}: first convolution takes {_channels(meta.channels)}, {meta.classes} classes "
        f"({how})"
    )


def _resize_note(name: str, given: int, size: int, *, built_for: bool) -> str:
    how = (
        f"built for {size}x{size}"
        if built_for
        else f"the smallest size tried it takes is {size}x{size}"
    )
    return (
        f"{name} does not take {given}x{given} images ({how}): each batch is resized to "
        f"{size}x{size} on the fly (bilinear, a parameter-free input stage; the weights are "
        "the model's own)."
    )


def _resized(model: nn.Module, size: int) -> nn.Module:
    model.register_forward_pre_hook(InputResize(size))
    return model


def _sizes_above(size: int) -> list[int]:
    return [s for s in PROBE_SIZES if s > size]


# --- plug-ins and the probe -------------------------------------------------------------------


def _plugin_build(name: str, meta: DatasetMeta) -> nn.Module:
    point = catalogue.model_plugins()[name]
    try:
        build: Callable[..., Any] = point.load()
        model = build(
            num_classes=meta.classes, in_channels=meta.channels, image_size=meta.image_size
        )
    except Exception as exc:
        raise ModelRefused(
            f"the plug-in model {name} ({point.value}) failed to build: {exc}"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ModelRefused(
            f"the plug-in model {name} ({point.value}) returned {type(model).__name__}, not a "
            "torch.nn.Module"
        )
    return model


def _size_checked(name: str, model: nn.Module, meta: DatasetMeta) -> int:
    failure = probe(model, meta.channels, meta.image_size, meta.classes)
    if failure is not None:
        raise ModelRefused(
            f"{name}, built for {meta.image_size}x{meta.image_size} images, does not take "
            f"them: {failure}"
        )
    return meta.image_size


@torch.no_grad()
def probe(model: nn.Module, channels: int, size: int, classes: int) -> str | None:
    """None where ``model`` maps a batch of one ``channels`` x ``size`` x ``size`` image to
    ``classes`` logits, else why not (no grad, eval mode: nothing about the model changes)."""
    training = model.training
    model.eval()
    try:
        out = model(torch.zeros(1, channels, size, size))
    except Exception as exc:  # any layer may object, each in its own words
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        model.train(training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return f"its output is {got}, not the {classes} logits of each image"
    return None


# --- weights -------------------------------------------------------------------------------


def weights_load(model: nn.Module, path: Path, *, name: str) -> str:
    """Load a local state-dict file (or a Trainyard checkpoint's model) into ``model``; a
    clear error where its keys or shapes do not fit. Returns the note."""
    from training.checkpoint import FORMAT

    try:
        # weights_only: a weights file is data; it must not run code when loaded.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ModelRefused(
            f"--weights {path}: not a state-dict file torch can read ({exc})"
        ) from exc
    what = "state dict"
    if isinstance(state, dict) and state.get("format") == FORMAT:
        state, what = state.get("model"), "Trainyard checkpoint's model"
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelRefused(f"--weights {path}: holds no state dict (names to tensors)")
    if state and all(k.startswith("module.") for k in state):  # saved from a DP/DDP wrapper
        state = {k[len("module.") :]: v for k, v in state.items()}
    mismatch = weights_mismatch(model.state_dict(), state)
    if mismatch:
        raise ModelRefused(f"--weights {path} does not fit {name} as built here: {mismatch}")
    model.load_state_dict(state)
    return f"{name}: weights loaded from {path} ({what}, {len(state)} tensors)."


def weights_mismatch(expected: dict[str, torch.Tensor], given: dict[str, torch.Tensor]) -> str:
    """What differs between two state dicts, in words ("" where they fit)."""
    missing = [k for k in expected if k not in given]
    extra = [k for k in given if k not in expected]
    shapes = [
        f"{k} is {tuple(given[k].shape)} there, {tuple(v.shape)} here"
        for k, v in expected.items()
        if k in given and given[k].shape != v.shape
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_some(missing)})")
    if extra:
        parts.append(f"{len(extra)} unexpected ({_some(extra)})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape ({_some(shapes)})")
    return "; ".join(parts)


def _some(items: list[str]) -> str:
    return ", ".join(items[:3]) + (", ..." if len(items) > 3 else "")


def _channels(n: int) -> str:
    return f"{n} channel" + ("" if n == 1 else "s")


# --- stages, for model-parallel and pipeline ------------------------------------------------


def model_stages(
    name: str, model: nn.Module, *, stages: int = 2, strategy: str = "model-parallel"
) -> list[Part]:
    """The parts ``model-parallel`` places and ``pipeline`` runs one after another: a plug-in's
    declared ``build.stages(model)``, else the model's top-level children. Refused
    (ModelRefused) where fewer than ``stages`` have parameters (each stage needs some), or a
    plug-in declares none."""
    point = catalogue.model_plugins().get(name)
    if point is not None and name not in catalogue.BUILTIN_MODELS:
        declared = getattr(point.load(), "stages", None)
        if not callable(declared):
            raise ModelRefused(
                f"{strategy} cannot split the plug-in model {name}: its build declares no "
                "stages (build.stages(model) -> [(name, module), ...])"
            )
        parts: list[Part] = list(declared(model))
    else:
        parts = list(model.named_children())
    with_params = [part for part, module in parts if _params(module)]
    if len(with_params) < stages:
        raise ModelRefused(
            f"{strategy} cannot split {name} into {stages} stages: it has "
            f"{len(with_params)} top-level part(s) with parameters "
            f"({', '.join(with_params) or 'none'}), and each stage needs one"
        )
    return parts


def model_stage_count(parts: list[Part]) -> int:
    """The most stages ``parts`` cut into: one per part that holds parameters."""
    return sum(1 for _, module in parts if _params(module))


def model_stage_limit(name: str, *, seq_len: int | None = None) -> int | None:
    """The most stages ``name`` cuts into (``model_stage_count``), from the model built for
    MNIST (a plug-in language model: for windows of ``seq_len``) on the meta device (no memory,
    no weights): the CLI refuses more pipeline ranks before any starts. None where it cannot
    tell (the model fails to build so); the engine refuses then."""
    try:
        with torch.device("meta"):
            meta = DatasetMeta("mnist", 10, 1, 28)
            model = model_build_for(name=name, meta=meta, seq_len=seq_len).model
            return model_stage_count(model_stages(name, model, stages=1))
    except Exception:  # building it for the run says why
        return None


def stages_balance(parts: list[Part]) -> tuple[list[Part], list[Part]]:
    """``parts`` cut in two, in order, where the parameter counts of the two sides are closest;
    each side holds parameters."""
    first, second = stages_split(parts, 2)
    return first, second


def stages_split(parts: list[Part], count: int) -> list[list[Part]]:
    """``parts`` cut into ``count`` stages, in order, each holding parameters, the largest
    stage as small as it can be (by parameters; the earliest such cuts). ``count`` must not
    exceed ``model_stage_count(parts)``."""
    counts = [_params(module) for _, module in parts]
    # best[k][i]: (the largest stage, the cuts) of parts[:i] in k stages, each with parameters.
    best: dict[tuple[int, int], tuple[int, list[int]]] = {(0, 0): (0, [])}
    for k in range(1, count + 1):
        for i in range(1, len(parts) + 1):
            options = [
                (max(best[k - 1, j][0], sum(counts[j:i])), [*best[k - 1, j][1], j])
                for j in range(i)
                if (k - 1, j) in best and sum(counts[j:i]) > 0
            ]
            if options:
                best[k, i] = min(options, key=lambda option: option[0])
    if (count, len(parts)) not in best:
        raise ValueError(f"{len(parts)} parts do not cut into {count} stages with parameters")
    cuts = [*best[count, len(parts)][1][1:], len(parts)]
    starts = [0, *cuts[:-1]]
    return [parts[a:b] for a, b in zip(starts, cuts, strict=True)]


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- the tensor-parallel plan, for tensor-parallel and fsdp-tp ---------------------------------

TENSOR_STYLES = ("colwise", "rowwise")  # a linear layer split by output, or by input features


def model_tensor_plan(name: str, model: nn.Module) -> dict[str, str]:
    """The plan ``tensor-parallel`` and ``fsdp-tp`` split ``model`` by: module path -> "colwise"
    or "rowwise", as the model declares it (``training.catalogue.model_tensor_parallel``): the
    built-in's ``tensor_parallel_plan``, a plug-in's ``build.tensor_parallel(model)``. Refused
    (ModelRefused) where none is declared, or where it names what is not a linear layer."""
    declared = getattr(model, "tensor_parallel_plan", None)
    point = catalogue.model_plugins().get(name)
    if point is not None and name not in catalogue.BUILTIN_MODELS:
        builder = getattr(point.load(), "tensor_parallel", None)
        declared = builder(model) if callable(builder) else None
    if not isinstance(declared, dict) or not declared:
        raise ModelRefused(catalogue.no_tensor_plan_message(name))
    plan = {str(path): str(style) for path, style in declared.items()}
    for path, style in plan.items():
        _tensor_layer_check(name, model, path, style)
    return plan


def _tensor_layer_check(name: str, model: nn.Module, path: str, style: str) -> None:
    if style not in TENSOR_STYLES:
        raise ModelRefused(
            f"{name}'s tensor-parallel plan gives {path} the style {style!r}, not one of "
            f"{', '.join(TENSOR_STYLES)}"
        )
    try:
        module: nn.Module | None = model.get_submodule(path)
    except AttributeError:
        module = None
    if not isinstance(module, nn.Linear):
        what = "no module" if module is None else f"a {type(module).__name__}"
        raise ModelRefused(
            f"{name}'s tensor-parallel plan names {path}, which is {what}; it splits nn.Linear "
            "layers only"
        )


def tensor_plan_widths_check(name: str, model: nn.Module, plan: dict[str, str], ranks: int) -> None:
    """Refused (ModelRefused) where ``ranks`` does not divide a width the plan splits: the output
    features of a column-wise layer, the input features of a row-wise one."""
    for path, style in plan.items():
        layer = model.get_submodule(path)
        assert isinstance(layer, nn.Linear)
        width, what = (
            (layer.out_features, "output") if style == "colwise" else (layer.in_features, "input")
        )
        if width % ranks:
            raise ModelRefused(
                f"tensor parallel over {ranks} ranks cannot split {name}'s {path}: its "
                f"{width} {what} features do not divide by {ranks} (a {style} split); use a "
                "number of ranks that divides every width the plan splits"
            )
