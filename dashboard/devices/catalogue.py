"""What each worker machine can train, read from its report (training/catalogue.py wrote it):
its models, datasets, image folders and text folders (a language model's). The launch checks,
placement and the pages read it from here, so that an old report (a worker from before the
catalogue) means the same to all of them: the built-ins that train on data every worker has
(BUILTIN_MODELS and BUILTIN_DATASETS below, from training/catalogue.py)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from dashboard.devices.models import WorkerMachine
from dashboard.texts import bytes_text
from training import catalogue as engine_catalogue
from training.catalogue import IDX_DATASETS, IMAGEFOLDER
from training.text_catalogue import LANGUAGE_MODELS, TEXTFOLDER

# What a worker is taken to have where its report does not say (or there is none): the engine's
# built-in models that train on its built-in datasets (the IDX files, which every worker can
# have). Its language models are left out: their text (the Jargon File, a package) is not on
# every worker. Both lists are the engine's (training/catalogue.py), not copies of them.
BUILTIN_MODELS = tuple(m for m in engine_catalogue.BUILTIN_MODELS if m not in LANGUAGE_MODELS)
BUILTIN_DATASETS = IDX_DATASETS
CLOSE_NAMES = 5


@dataclass(frozen=True)
class MachineCatalogue:
    hostname: str
    models: tuple[str, ...]
    datasets: tuple[str, ...]
    # path -> {path, classes, images, bytes, layout}
    image_folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    # path -> {path, files, bytes, layout}: the users' text, for --dataset textfolder
    text_folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    models_splittable: tuple[str, ...] = ()
    models_tensor_parallel: tuple[str, ...] = ()  # those that declare a tensor-parallel plan
    models_stages: dict[str, int] = field(default_factory=dict)  # a plug-in's pipeline stages
    model_sources: dict[str, str] = field(default_factory=dict)
    # byte-llama and the plug-ins whose build declares a language model (only the workers have
    # a plug-in installed, so only their report says which it is)
    language_models: tuple[str, ...] = ()
    dataset_details: tuple[dict[str, Any], ...] = ()
    reported: bool = True  # False: an old report, taken as the built-ins only
    error: str = ""  # why the worker's catalogue failed, where it did


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {
        str(k): v
        for k, v in value.items()
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    }


def catalogue_from_report(*, hostname: str, report: dict[str, Any] | None) -> MachineCatalogue:
    report = report or {}
    if not isinstance(report.get("models"), list) or not isinstance(report.get("datasets"), list):
        # An old report, or one whose catalogue failed (facts.catalogue_facts_collect says why).
        return MachineCatalogue(
            error=str(report.get("catalogue_error") or ""),
            hostname=hostname,
            models=BUILTIN_MODELS,
            datasets=BUILTIN_DATASETS,
            models_splittable=BUILTIN_MODELS,
            models_tensor_parallel=BUILTIN_MODELS,
            model_sources={name: "built in" for name in BUILTIN_MODELS},
            reported=False,
        )
    folders = [
        f for f in report.get("image_folders") or [] if isinstance(f, dict) and f.get("path")
    ]
    texts = [f for f in report.get("text_folders") or [] if isinstance(f, dict) and f.get("path")]
    details = [d for d in report.get("dataset_details") or [] if isinstance(d, dict)]
    sources = report.get("model_sources")
    return MachineCatalogue(
        hostname=hostname,
        models=_names(report["models"]),
        datasets=_names(report["datasets"]),
        image_folders={str(f["path"]): f for f in folders},
        text_folders={str(f["path"]): f for f in texts},
        models_splittable=_names(report.get("models_splittable")),
        models_tensor_parallel=_names(report.get("models_tensor_parallel")),
        models_stages=_counts(report.get("models_stages")),
        model_sources=dict(sources) if isinstance(sources, dict) else {},
        language_models=_names(report.get("language_models")),
        dataset_details=tuple(details),
    )


def catalogue_of(machine: WorkerMachine) -> MachineCatalogue:
    return catalogue_from_report(hostname=machine.hostname, report=machine.report)


def catalogues_online() -> list[MachineCatalogue]:
    return [catalogue_of(machine) for machine in WorkerMachine.objects.online()]


def language_models_online() -> list[str]:
    """The language models a run may launch: byte-llama, and each plug-in an online worker
    reports as one."""
    reported = (name for c in catalogues_online() for name in c.language_models)
    return list(dict.fromkeys([*LANGUAGE_MODELS, *reported]))


def catalogue_missing(
    catalogue: MachineCatalogue, *, model: str, dataset: str, data_path: str
) -> list[str]:
    """What the machine lacks of what a run needs, as short phrases ("model resnet18",
    "image folder /data/pets"); empty when it has all."""
    missing = []
    if model not in catalogue.models:
        missing.append(f"model {model}")
    if dataset not in catalogue.datasets:
        missing.append(f"dataset {dataset}")
    elif dataset == IMAGEFOLDER and data_path and data_path not in catalogue.image_folders:
        missing.append(f"image folder {data_path}")
    elif dataset == TEXTFOLDER and data_path and data_path not in catalogue.text_folders:
        missing.append(f"text folder {data_path}")
    return missing


def close_names(name: str, names: list[str]) -> list[str]:
    """The names most like `name` (a typo's fix), else the first few."""
    return difflib.get_close_matches(name, names, n=CLOSE_NAMES, cutoff=0.5)


def catalogue_card(catalogue: MachineCatalogue) -> dict[str, Any]:
    """The device page's view of what a machine can train (the template and static/js/devices.js
    show this as given): the models counted by source (the list folded), the datasets with
    where they are and their size, the image folders."""
    groups: dict[str, list[str]] = {}
    for name in catalogue.models:
        groups.setdefault(catalogue.model_sources.get(name, "built in"), []).append(name)
    details = {str(d.get("name")): d for d in catalogue.dataset_details}
    return {
        "reported": catalogue.reported,
        "note": _note(catalogue),
        "models_text": ", ".join(f"{len(names)} {source}" for source, names in groups.items()),
        "model_groups": [{"source": s, "models": names} for s, names in groups.items()],
        "datasets": [
            {
                "name": name,
                "where": str(details.get(name, {}).get("where") or ""),
                "size_text": _size_text(details.get(name, {}).get("bytes")),
                "source": str(details.get(name, {}).get("source") or ""),
            }
            for name in catalogue.datasets
        ],
        "image_folders": [
            {
                "path": path,
                "classes": f.get("classes"),
                "images": f.get("images"),
                "size_text": _size_text(f.get("bytes")),
                "layout": f.get("layout") or "",
            }
            for path, f in catalogue.image_folders.items()
        ],
        "text_folders": [
            {
                "path": path,
                "files": f.get("files"),
                "size_text": _size_text(f.get("bytes")),
                "layout": f.get("layout") or "",
            }
            for path, f in catalogue.text_folders.items()
        ],
    }


BUILTINS = (
    f"taken as the built-ins, {' and '.join(BUILTIN_MODELS)} on {' and '.join(BUILTIN_DATASETS)}"
)
OLD_REPORT_NOTE = (
    f"this worker's report lists no models or datasets (a worker from before the catalogue): "
    f"{BUILTINS}"
)


def _note(catalogue: MachineCatalogue) -> str:
    if catalogue.reported:
        return ""
    if catalogue.error:
        return f"the worker could not list its models and datasets ({catalogue.error}): {BUILTINS}"
    return OLD_REPORT_NOTE


def _size_text(value: Any) -> str:
    return bytes_text(value if isinstance(value, int | float) else None)
