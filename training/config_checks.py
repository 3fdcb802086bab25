"""What the command line refuses once argparse has read each flag alone: flags that do not go
together (an option the strategy does not read, --nnodes without a rendezvous, --data-path
without --dataset imagefolder), files that are not there, a model the catalogue does not know.

``training.config.parse_args`` calls each check in turn; a check that refuses says
``parser.error`` in its flag's words (usage on stderr, exit 2), as argparse does for one flag.
The rules the dashboard refuses too come from ``training.refusals``, so both say no to the same
requests; the rest are the command line's own.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from training import catalogue
from training.catalogue import IMAGEFOLDER, image_folder_facts
from training.refusals import language_refusals, option_refusals
from training.registry import (
    OPTIONS_DECLARED,
    RESHARD_STRATEGIES,
    SYNC_BATCHNORM_CPU_REASON,
    SYNC_BATCHNORM_STRATEGIES,
    TENSOR_PARALLEL_STRATEGIES,
    TORCHRUN_STRATEGIES,
    OptionValue,
)
from training.text_catalogue import (
    BYTE_LLAMA_SIZE_DEFAULT,
    LANGUAGE_MODELS,
    TEXT_ROOTS_ENV,
    TEXTFOLDER,
    model_size_get,
    path_under,
    text_layout,
    text_roots,
)


def paths_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--resume and --weights name files that exist (read later, by the engine); a script's
    checkpoint may be a folder (Hugging Face's checkpoint-N)."""
    resume = None if ns.resume is None else Path(ns.resume)
    if resume is not None and not (resume.is_file() or ns.strategy == "script" and resume.is_dir()):
        parser.error(f"argument --resume: no checkpoint file at {ns.resume}")
    if ns.weights is not None and not Path(ns.weights).is_file():
        parser.error(f"argument --weights: no file at {ns.weights}")


def options_check(
    ns: argparse.Namespace, parser: argparse.ArgumentParser
) -> dict[str, OptionValue]:
    """The strategies' own settings for TrainConfig: the given ones where the strategy reads
    them (refused where it does not, or where a value needs GPUs), else their defaults."""
    given = {option.name: getattr(ns, option.name) for option in OPTIONS_DECLARED}
    for option, reason in option_refusals(ns.strategy, values=given, gpus=ns.gpus):
        parser.error(f"argument {option.flag}: {reason}")
    return {
        option.name: option.default if given[option.name] is None else given[option.name]
        for option in OPTIONS_DECLARED
    }


def multinode_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--nnodes 2 or more: a strategy torchrun starts, and a rendezvous (HOST:PORT and an id);
    the rendezvous flags only then."""
    given = [
        flag
        for flag, value in (
            ("--rdzv-endpoint", ns.rdzv_endpoint),
            ("--rdzv-id", ns.rdzv_id),
            ("--rdzv-host", ns.rdzv_host),
            ("--local-addr", ns.local_addr),
        )
        if value
    ]
    if ns.nnodes == 1:
        if given:
            parser.error(f"argument {given[0]}: only with --nnodes 2 or more")
        return
    if ns.strategy not in TORCHRUN_STRATEGIES:
        parser.error(
            f"argument --nnodes: --strategy {ns.strategy} runs on one machine; use --strategy "
            f"{' or '.join(TORCHRUN_STRATEGIES)}"
        )
    if not ns.rdzv_endpoint or not ns.rdzv_id:
        parser.error("argument --nnodes: several machines need --rdzv-endpoint and --rdzv-id")
    host, _, port = ns.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        parser.error("argument --rdzv-endpoint: expected HOST:PORT, e.g. 10.0.0.1:29400")


def reshard_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--no-reshard-after-forward only for the strategies that reshard (FSDP2's)."""
    if not ns.reshard_after_forward and ns.strategy not in RESHARD_STRATEGIES:
        parser.error(
            "argument --no-reshard-after-forward: applies to --strategy "
            f"{' or '.join(RESHARD_STRATEGIES)} only, not {ns.strategy}"
        )


def data_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """--data-path resolved; refused where the dataset does not take one, required (and looked
    at, without decoding) where it does. The engine checks the rest (train/val classes)."""
    if ns.dataset == TEXTFOLDER:
        return _text_folder_check(ns, parser)
    if ns.dataset != IMAGEFOLDER:
        if ns.data_path is not None:
            parser.error(
                f"argument --data-path: only with --dataset {IMAGEFOLDER} or {TEXTFOLDER}, not "
                f"{ns.dataset} (its files are found under --data-dir)"
            )
        return None
    if not ns.data_path:
        parser.error(f"argument --data-path: required with --dataset {IMAGEFOLDER}")
    path = Path(ns.data_path).expanduser().resolve()
    if not path.exists():
        parser.error(f"argument --data-path: no such folder: {ns.data_path}")
    facts = image_folder_facts(path) if path.is_dir() else None
    if facts is None:
        parser.error(
            f"argument --data-path: {ns.data_path} is not an image folder (class folders of "
            "images, directly or under train/ and val/ or test/)"
        )
    if facts.classes < 2:
        parser.error(
            f"argument --data-path: {ns.data_path} has {facts.classes} class folder(s) with "
            "images; classifying needs at least two"
        )
    return str(path)


def _text_folder_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    """A text folder: given, holding .txt files, and under the text roots (the folders a worker
    reads users' text from, as its image folders are found under the image roots)."""
    if not ns.data_path:
        parser.error(f"argument --data-path: required with --dataset {TEXTFOLDER}")
    path = Path(ns.data_path).expanduser().resolve()
    roots = text_roots(Path(ns.data_dir).expanduser().resolve())
    if not path_under(path, roots):
        parser.error(
            f"argument --data-path: {ns.data_path} is not under the text folders' roots "
            f"({', '.join(str(r) for r in roots)}; ${TEXT_ROOTS_ENV} adds more)"
        )
    if text_layout(path) is None:
        parser.error(f"argument --data-path: {ns.data_path} holds no .txt files with text in them")
    return str(path)


@dataclass(frozen=True)
class LanguageSettings:
    """A language model's settings for TrainConfig (None where the model is not one)."""

    model_size: str | None
    seq_len: int | None
    sequence_parallel: bool


def language_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> LanguageSettings:
    """--model-size and --seq-len only for a language model, --sequence-parallel only where
    tensor parallel splits one; the pairing of model and data and the widths a tensor-parallel
    degree must divide (``training.refusals.language_refusals``, the dashboard's too)."""
    language = catalogue.model_language(ns.model)
    given = [flag for flag, value in (("--model-size", ns.model_size), ("--seq-len", ns.seq_len),
                                      ("--sequence-parallel", ns.sequence_parallel))
             if value is not None]  # fmt: skip
    if given and not language:
        parser.error(
            f"argument {given[0]}: only with a language model (--model "
            f"{' or '.join(LANGUAGE_MODELS)}), not {ns.model}"
        )
    processes = ns.nproc if ns.nproc is not None else len(ns.gpus) or 2
    for refusal in language_refusals(
        ns.strategy, model=ns.model, dataset=ns.dataset, processes=processes,
        model_size=ns.model_size, seq_len=ns.seq_len, sequence_parallel=ns.sequence_parallel,
    ):  # fmt: skip
        parser.error(refusal.cli_message)
    if ns.sequence_parallel is not None and ns.strategy not in TENSOR_PARALLEL_STRATEGIES:
        parser.error(
            f"argument --sequence-parallel: applies to --strategy "
            f"{' or '.join(TENSOR_PARALLEL_STRATEGIES)} only, not {ns.strategy}"
        )
    if not language:
        return LanguageSettings(None, None, True)
    if ns.model not in LANGUAGE_MODELS:
        return _plugin_language(ns)
    size = model_size_get(ns.model_size or BYTE_LLAMA_SIZE_DEFAULT)
    sequence_parallel = ns.sequence_parallel is not False  # on unless turned off
    return LanguageSettings(size.name, ns.seq_len or size.seq_len, sequence_parallel)


def _plugin_language(ns: argparse.Namespace) -> LanguageSettings:
    """A plug-in language model: its own size and its own plan (sequence parallel or not is
    its plan's: language_refusals refused the flags), its window --seq-len or its build's."""
    return LanguageSettings(None, ns.seq_len or catalogue.language_plugin_window(ns.model), True)


def model_check(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--model names a model of the catalogue (close matches said where not), one that declares
    a tensor-parallel plan for the strategies that split by it; --sync-batchnorm only where it
    can run."""
    if ns.sync_batchnorm and ns.strategy not in SYNC_BATCHNORM_STRATEGIES:
        parser.error(
            f"argument --sync-batchnorm: applies to --strategy "
            f"{' or '.join(SYNC_BATCHNORM_STRATEGIES)} only, not {ns.strategy}"
        )
    if ns.sync_batchnorm and not ns.gpus:
        parser.error(f"argument --sync-batchnorm: {SYNC_BATCHNORM_CPU_REASON}")
    if ns.model in catalogue.BUILTIN_MODELS:
        return  # the built-ins: no need to import torchvision to know them
    entries = {entry.name: entry for entry in catalogue.model_entries()}
    if ns.model not in entries:
        message = catalogue.unknown_model_message(ns.model, list(entries))
        parser.error(f"argument --model: {message}")
    if ns.strategy in TENSOR_PARALLEL_STRATEGIES and not catalogue.model_tensor_parallel(
        entries[ns.model]
    ):
        parser.error(f"argument --model: {catalogue.no_tensor_plan_message(ns.model)}")


SCRIPT_FLAGS = ("--code-dir", "--entrypoint")


@dataclass(frozen=True)
class ScriptSettings:
    """A script run's code (TrainConfig.script): its entry point (relative to code_dir), its
    arguments (those after ``--`` on the command line), and the seconds its ranks get to agree
    on a Stop, save and leave."""

    code_dir: str
    entrypoint: str
    args: tuple[str, ...]
    stop_grace: float


def script_check(
    ns: argparse.Namespace, parser: argparse.ArgumentParser, *, args: list[str], cut: bool
) -> ScriptSettings | None:
    """--strategy script needs its folder and an entry point inside it (a file); its arguments
    (after --) and these flags are refused with any other strategy. None for the engine's own
    strategies."""
    given = [flag for flag in SCRIPT_FLAGS if getattr(ns, flag[2:].replace("-", "_"))]
    if ns.strategy != "script":
        if given or cut:
            what = " and ".join(given) if given else "arguments after --"
            parser.error(f"{what}: only with --strategy script (your own script's)")
        return None
    missing = [flag for flag in SCRIPT_FLAGS if flag not in given]
    if missing:
        parser.error(f"--strategy script needs {' and '.join(missing)}")
    folder = Path(ns.code_dir).expanduser().resolve()
    entry = Path(ns.entrypoint)
    if entry.is_absolute() or ".." in entry.parts:
        parser.error(f"argument --entrypoint: {ns.entrypoint} must be a path inside --code-dir")
    if not (folder / entry).is_file():
        parser.error(f"argument --entrypoint: no file {ns.entrypoint} in {folder}")
    return ScriptSettings(code_dir=str(folder), entrypoint=str(entry), args=tuple(args),
                          stop_grace=float(ns.stop_grace))  # fmt: skip
