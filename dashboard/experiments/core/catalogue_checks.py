"""The launch checks of a run's model, dataset and data path against what the online workers
report (dashboard/devices/catalogue.py): one home, called by the launch form, which the JSON
API and every cell of a study go through. Each refusal names its field and says what there is.

With no worker online, the built-ins (simple-cnn on mnist or fashion-mnist) still queue, as
before the catalogue: every worker has them. Anything else is refused, since nothing says a
worker will ever have it."""

from __future__ import annotations

import functools
import os
from typing import Any

from dashboard.devices.catalogue import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    MachineCatalogue,
    catalogue_missing,
    catalogues_online,
    close_names,
)
from training.catalogue import IMAGEFOLDER, SPLIT_STRATEGIES, no_tensor_plan_message
from training.refusals import plural
from training.registry import TENSOR_PARALLEL_STRATEGIES
from training.text_catalogue import TEXT_ROOTS_ENV, TEXT_ROOTS_SUBDIR, TEXTFOLDER

# The datasets that read a folder given as data_path: their folders, as a worker reports them.
FOLDER_DATASETS = (IMAGEFOLDER, TEXTFOLDER)

Errors = dict[str, list[str]]
LISTED_MAX = 8  # names said in a message before "and N more"


def data_path_normalise(*, dataset: str, data_path: str | None) -> str:
    """Only imagefolder and textfolder read a path: elsewhere it is dropped, not refused (the
    form keeps the field, hidden, while the user switches datasets). A trailing slash is no
    other folder."""
    if dataset not in FOLDER_DATASETS or not data_path or not data_path.strip():
        return ""
    return os.path.normpath(data_path.strip())


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED_MAX])
    more = len(names) - LISTED_MAX
    return f"{shown} and {more} more" if more > 0 else shown or "none"


def _union(catalogues: list[MachineCatalogue], attribute: str) -> list[str]:
    return list(dict.fromkeys(name for c in catalogues for name in getattr(c, attribute)))


def _offline_check(*, model: str, dataset: str) -> Errors:
    if model in BUILTIN_MODELS and dataset in BUILTIN_DATASETS:
        return {}  # queues until a worker comes, as it always did
    errors: Errors = {}
    builtins = f"only {', '.join(BUILTIN_MODELS)} on {' or '.join(BUILTIN_DATASETS)} waits for one"
    if model not in BUILTIN_MODELS:
        errors["model"] = [f"no worker is online, so none has model {model}; {builtins}"]
    if dataset not in BUILTIN_DATASETS:
        errors["dataset"] = [f"no worker is online, so none has dataset {dataset}; {builtins}"]
    return errors


def _model_check(*, model: str, catalogues: list[MachineCatalogue]) -> list[str]:
    names = _union(catalogues, "models")
    if model in names:
        return []
    close = close_names(model, names)
    hint = f"close names: {', '.join(close)}" if close else f"they have {_listed(names)}"
    return [f"no online worker has model {model!r} ({plural(len(names), 'model')}); {hint}"]


def _dataset_check(*, dataset: str, catalogues: list[MachineCatalogue]) -> list[str]:
    names = _union(catalogues, "datasets")
    if dataset in names:
        return []
    hint = close_names(dataset, names)
    return [
        f"no online worker has dataset {dataset!r}"
        + (f" (did you mean {', '.join(hint)}?)" if hint else "")
        + f"; the workers have {_listed(names)}"
    ]


NO_FOLDER = {
    False: "no online worker reports an image folder (they look under <data dir>/imagefolders "
    "and $TRAINYARD_IMAGE_FOLDERS)",
    True: f"no online worker reports a text folder (they look under <data dir>/{TEXT_ROOTS_SUBDIR} "
    f"and ${TEXT_ROOTS_ENV})",
}


def _folder_size(facts: dict[str, Any], *, text: bool) -> str:
    if text:
        return plural(int(facts.get("files") or 0), "file")
    return plural(int(facts.get("classes") or 0), "class", "classes")


def folders_text(catalogues: list[MachineCatalogue], *, text: bool = False) -> str:
    """ "host-a: /data/pets (37 classes), ..." or a sentence saying where folders are looked for;
    ``text``: the text folders ("host-a: /data/textfolders/poems (3 files)")."""
    parts = [
        f"{c.hostname}: {path} ({_folder_size(f, text=text)})"
        for c in catalogues
        for path, f in (c.text_folders if text else c.image_folders).items()
    ]
    if not parts:
        return NO_FOLDER[text]
    return "the workers have " + "; ".join(parts[:LISTED_MAX])


def _data_path_check(*, data_path: str, catalogues: list[MachineCatalogue]) -> list[str]:
    if not data_path:
        return [f"imagefolder needs data_path, a folder on the worker: {folders_text(catalogues)}"]
    found = [c.image_folders[data_path] for c in catalogues if data_path in c.image_folders]
    if not found:
        return [
            f"no online worker reports an image folder at {data_path}; {folders_text(catalogues)}"
        ]
    problems = [str(f["problem"]) for f in found if f.get("problem")]
    if len(problems) == len(found):
        return [f"{data_path} cannot be trained: {problems[0]}"]
    classes = max(int(f.get("classes") or 0) for f in found)
    if classes < 2:
        return [
            f"{data_path} has {plural(classes, 'class', 'classes')}; a classifier needs at least "
            "two (one folder per class)"
        ]
    return []


def _text_path_check(*, data_path: str, catalogues: list[MachineCatalogue]) -> list[str]:
    if not data_path:
        return [
            f"textfolder needs data_path, a folder of .txt files on the worker: "
            f"{folders_text(catalogues, text=True)}"
        ]
    if not any(data_path in c.text_folders for c in catalogues):
        return [
            f"no online worker reports a text folder at {data_path}; "
            f"{folders_text(catalogues, text=True)}"
        ]
    return []


def _split_check(*, model: str, strategy: str, catalogues: list[MachineCatalogue]) -> list[str]:
    if strategy not in SPLIT_STRATEGIES or splittable_reported(model=model, catalogues=catalogues):
        return []
    return [
        f"{strategy} splits the model into stages, and {model} declares none (a plug-in's build "
        "needs a `stages` attribute); pick another strategy or model"
    ]


def splittable_reported(*, model: str, catalogues: list[MachineCatalogue] | None = None) -> bool:
    """Whether a worker that has ``model`` (online, or of ``catalogues``) reports that it cuts
    into stages (a plug-in's build declares its parts)."""
    found = catalogues_online() if catalogues is None else catalogues
    return model in _union([c for c in found if model in c.models], "models_splittable")


def _tensor_plan_check(
    *, model: str, strategy: str, catalogues: list[MachineCatalogue]
) -> list[str]:
    if strategy not in TENSOR_PARALLEL_STRATEGIES:
        return []
    having = [c for c in catalogues if model in c.models]
    if model in _union(having, "models_tensor_parallel"):
        return []
    return [no_tensor_plan_message(model)]


def _together_check(
    *, need: dict[str, str], catalogues: list[MachineCatalogue], nodes: int, machines: list[str]
) -> Errors:
    """The model, dataset and folder on one machine together (on every pinned machine; on
    `nodes` machines for a run over several): what is missing where, when not."""
    missing = {c.hostname: catalogue_missing(c, **need) for c in catalogues}
    where = "; ".join(f"{host} lacks {', '.join(m)}" for host, m in sorted(missing.items()) if m)
    if machines:
        lacking = [name for name in machines if missing.get(name)]
        if lacking:
            return {"machines": [f"the named machines must have what the run needs: {where}"]}
        return {}
    having = [host for host, m in missing.items() if not m]
    # Too few machines at all is the capacity check's to say (it names what there is).
    if len(having) >= max(1, nodes) or len(having) == len(missing):
        return {}
    field = "nodes" if nodes > 1 and having else "dataset"
    wanted = f"{need['model']} and {need['dataset']}"
    return {
        field: [f"{plural(len(having), 'online worker has', 'online workers have')} both "
                f"{wanted}, the run needs {plural(max(1, nodes), 'machine')}: {where}"]
    }  # fmt: skip


def training_set_size(*, dataset: str, catalogues: list[MachineCatalogue]) -> int | None:
    """The fewest training images of `dataset` an online worker that has it reports (the
    MNIST sample's 4,000 where a worker has only the sample); None where none says."""
    sizes = [
        int(d["train_images"])
        for c in catalogues
        for d in c.dataset_details
        if d.get("name") == dataset and isinstance(d.get("train_images"), int)
    ]
    return min(sizes) if sizes else None


def _batch_check(
    *, dataset: str, global_batch: int | None, made: str, catalogues: list[MachineCatalogue]
) -> list[str]:
    """A global batch larger than the training set is refused: the epoch would be one short
    step (DDP x2 with 8,192 on the sample's 4,000 'succeeded' after one step at 36.5%)."""
    size = training_set_size(dataset=dataset, catalogues=catalogues)
    if global_batch is None or size is None or global_batch <= size:
        return []
    return [global_batch_refusal(dataset=dataset, size=size, global_batch=global_batch, made=made)]


def global_batch_refusal(*, dataset: str, size: int, global_batch: int, made: str) -> str:
    """Why a global batch larger than the training set is refused, with what fits."""
    return (
        f"the global batch, {global_batch:,} images a step ({made}), is larger than "
        f"{dataset}'s training set on the workers ({size:,} images): an epoch would be one "
        f"short step. Make the global batch at most {size:,}, or better a tenth of it"
    )


def launch_catalogue_check(
    *, model: str, dataset: str, data_path: str, strategy: str, nodes: int = 1,
    machines: list[str] | None = None, global_batch: int | None = None, batch_made: str = "",
) -> Errors:  # fmt: skip
    """The refusals, by field; empty when some online worker (or `nodes` of them, or every
    pinned one) has the model, the dataset and the image folder."""
    catalogues = catalogues_online()
    if not catalogues:
        return _offline_check(model=model, dataset=dataset)
    errors: Errors = {}
    checks: dict[str, Any] = {
        "model": _model_check(model=model, catalogues=catalogues)
        or _split_check(model=model, strategy=strategy, catalogues=catalogues)
        or _tensor_plan_check(model=model, strategy=strategy, catalogues=catalogues),
        "dataset": _dataset_check(dataset=dataset, catalogues=catalogues),
    }
    if dataset == IMAGEFOLDER and not checks["dataset"]:
        checks["data_path"] = _data_path_check(data_path=data_path, catalogues=catalogues)
    if dataset == TEXTFOLDER and not checks["dataset"]:
        checks["data_path"] = _text_path_check(data_path=data_path, catalogues=catalogues)
    if not checks["dataset"]:
        checks["batch_size"] = _batch_check(
            dataset=dataset, global_batch=global_batch, made=batch_made, catalogues=catalogues
        )
    errors = {name: why for name, why in checks.items() if why}
    if errors:
        return errors
    need = {"model": model, "dataset": dataset, "data_path": data_path}
    return _together_check(need=need, catalogues=catalogues, nodes=nodes, machines=machines or [])


def pipeline_stage_limit(*, model: str) -> int | None:
    """The most pipeline stages ``model`` cuts into, where this server can tell: the built-in
    and torchvision's models, built on the meta device (no memory, no weights) once per process,
    so torch is imported here only when a pipeline is launched. A plug-in's model is on the
    workers alone: the fewest stages a worker that has it reports (None where none reports it:
    its run then refuses more stages than it has at start, with the reason)."""
    catalogues = catalogues_online()
    sources = {c.model_sources.get(model) for c in catalogues}
    if model in BUILTIN_MODELS or "torchvision" in sources:
        return _stage_limit(model)
    counts = [c.models_stages[model] for c in catalogues if model in c.models_stages]
    return min(counts) if counts else None


def stage_limits_known() -> dict[str, int]:
    """The stage limits the launch form can say before launch: the built-in models' (cheap,
    cached) and the plug-ins' the online workers report; a torchvision model's is counted at
    launch (building each on the meta device for the page would cost seconds)."""
    limits: dict[str, int] = {}
    for model in BUILTIN_MODELS:
        stages = _stage_limit(model)
        if stages is not None:
            limits[model] = stages
    for catalogue in catalogues_online():
        for model, stages in catalogue.models_stages.items():
            limits[model] = min(stages, limits.get(model, stages))
    return limits


@functools.cache
def _stage_limit(model: str) -> int | None:
    from training.models.build import model_stage_limit

    return model_stage_limit(model)
