"""What the launch form offers: the models, datasets, image folders and text folders the online
workers report, grouped by where they come from, each with a line saying what it is, and a
language model's sizes (core/language_fields.py). The page is sent
these (its JSON), the script only shows the line of the chosen one and keeps no list itself."""

from __future__ import annotations

from typing import Any

from dashboard.devices.catalogue import (
    BUILTIN_DATASETS,
    BUILTIN_MODELS,
    MachineCatalogue,
    catalogues_online,
)
from dashboard.experiments.core.catalogue_checks import training_set_size
from dashboard.experiments.core.language_fields import language_facts
from dashboard.texts import bytes_text
from training.catalogue import IMAGEFOLDER, MNIST_SAMPLE_NAME, MODEL_DEFAULT
from training.text_catalogue import BYTE_LLAMA, JARGON, TEXTFOLDER

SOURCE_HELP = {
    "built in": "Trainyard's own model, on every worker.",
    "torchvision": "A torchvision classifier, built untrained (weights=None); its first layer "
    "and its classes are fitted to the dataset, as the run's notes say.",
    "plug-in": "A model of your own, from a package installed on the worker "
    "(entry point trainyard.models).",
}
# A built-in model's own line, in place of its source's (the form shows the chosen model's).
BUILTIN_MODEL_HELP = {
    MODEL_DEFAULT: "Trainyard's small CNN for 28x28 images: the default, and the fastest to train.",
    BYTE_LLAMA: "Trainyard's Llama-style language model over bytes (no tokenizer): pick its "
    "size and window below; it trains on text (jargon or a text folder).",
}
BUILTIN_DATASET_HELP = {
    "mnist": "Handwritten digits, 28x28 grey, 10 classes.",
    "fashion-mnist": "Clothes, 28x28 grey, 10 classes.",
    JARGON: "Text for a language model: the Jargon File (1.7 MB of hackers' English, public "
    "domain), its last tenth held out.",
}
IMAGEFOLDER_HELP = "An image folder on the worker: one folder per class (train/ and val/ or test/)."
TEXTFOLDER_HELP = (
    "Text for a language model: your .txt files in a folder on the worker (train/ and val/, or "
    "one folder whose last tenth is held out)."
)
FOLDER_HELP = {IMAGEFOLDER: IMAGEFOLDER_HELP, TEXTFOLDER: TEXTFOLDER_HELP}


def source_help(source: str) -> str:
    return SOURCE_HELP["plug-in" if source.startswith("plug-in") else source] if source else ""


def _model_groups(catalogues: list[MachineCatalogue]) -> list[dict[str, Any]]:
    """[{source, help, models: [name, ...]}], the built-in first, then as the workers list."""
    groups: dict[str, list[str]] = {}
    for catalogue in catalogues:
        for name in catalogue.models:
            source = catalogue.model_sources.get(name, "built in")
            if name not in groups.setdefault(source, []):
                groups[source].append(name)
    return [
        {"source": source, "help": source_help(source), "models": names,
         "model_help": {name: BUILTIN_MODEL_HELP[name] for name in names
                        if source == "built in" and name in BUILTIN_MODEL_HELP}}
        for source, names in groups.items()
    ]  # fmt: skip


def _datasets(catalogues: list[MachineCatalogue]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for catalogue in catalogues:
        details = {str(d.get("name")): d for d in catalogue.dataset_details}
        for name in catalogue.datasets:
            detail = details.get(name, {})
            row = rows.setdefault(
                name, {"name": name, "label": name, "machines": [], "help": "", "sample": []}
            )
            row["machines"].append(catalogue.hostname)
            row["help"] = (
                row["help"]
                or BUILTIN_DATASET_HELP.get(name)
                or FOLDER_HELP.get(name)
                or str(detail.get("source") or "")
            )
            if detail.get("sample"):
                row["sample"].append((catalogue.hostname, str(detail.get("source") or "")))
    for row in rows.values():
        # "mnist" where a worker has only the offline sample: said in the choice and its help.
        if row["sample"]:
            hosts, source = [host for host, _ in row["sample"]], row["sample"][0][1]
            everywhere = len(hosts) == len(row["machines"])
            where = "" if everywhere else f" on {', '.join(hosts)}"
            row["label"] = f"{row['name']} ({MNIST_SAMPLE_NAME}{where})"
            row["help"] = f"{row['help']} {source[0].upper()}{source[1:]}{where}."
        row["train_images"] = training_set_size(dataset=row["name"], catalogues=catalogues)
        del row["sample"]
    return list(rows.values())


def _folder_what(facts: dict[str, Any], *, text: bool) -> str:
    if text:
        return f"{facts.get('files')} .txt files"
    return f"{facts.get('classes')} classes, {facts.get('images')} images"


def _folders(catalogues: list[MachineCatalogue], *, text: bool = False) -> list[dict[str, Any]]:
    """The image folders (``text``: the text folders) the workers report, each with its line
    and the machines that have it."""
    rows: dict[str, dict[str, Any]] = {}
    for catalogue in catalogues:
        for path, facts in (catalogue.text_folders if text else catalogue.image_folders).items():
            row = rows.setdefault(path, {**facts, "path": path, "machines": []})
            row["machines"].append(catalogue.hostname)
            row["help"] = (
                f"{_folder_what(facts, text=text)}, {bytes_text(facts.get('bytes'))}, "
                f"{facts.get('layout')}; on " + ", ".join(row["machines"])
            )
    return list(rows.values())


def launch_options() -> dict[str, Any]:
    """The form's options; with no worker online, the built-ins, which wait for one."""
    catalogues = catalogues_online()
    if not catalogues:
        catalogues = [
            MachineCatalogue(
                hostname="any worker",
                models=BUILTIN_MODELS,
                datasets=BUILTIN_DATASETS,
                model_sources={name: "built in" for name in BUILTIN_MODELS},
            )
        ]
    return {
        "model_groups": _model_groups(catalogues),
        "datasets": _datasets(catalogues),
        "image_folders": _folders(catalogues),
        "imagefolder": IMAGEFOLDER,
        "text_folders": _folders(catalogues, text=True),
        "textfolder": TEXTFOLDER,
        # Which models are language models, and each size's window and help.
        "language": language_facts(),
    }


def model_choices(options: dict[str, Any]) -> list[Any]:
    return [
        (group["source"], [(name, name) for name in group["models"]])
        for group in options["model_groups"]
    ]


def dataset_choices(options: dict[str, Any]) -> list[tuple[str, str]]:
    return [(row["name"], row.get("label") or row["name"]) for row in options["datasets"]]


def folder_choices(options: dict[str, Any]) -> list[Any]:
    """A folder on the worker: the image folders for imagefolder, the text folders for
    textfolder (the page's script shows the group of the dataset chosen)."""
    images = [(row["path"], row["path"]) for row in options["image_folders"]]
    texts = [(row["path"], row["path"]) for row in options["text_folders"]]
    groups = [(label, rows) for label, rows in (("Image folders", images),
                                                 ("Text folders", texts)) if rows]  # fmt: skip
    return [("", "— a folder on the worker —"), *groups]
