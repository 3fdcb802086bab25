"""A run as people read it: whether it is still going, how long it took, and its dataset,
devices, strategy and strategy options in words.

One home for these texts, moved off the model (issue 31): the read JSON (selectors.py), the
queue's JSON, the pages (their views put the texts in the context: templates only display) and
the exports all say a run's settings the same way, in the registry's words.
"""

from __future__ import annotations

import shlex
from typing import Any

from django.utils import timezone

from dashboard.experiments.models import (
    ACTIVE_STATUSES,
    PROCESS_STRATEGIES,
    Dataset,
    Experiment,
    option_title,
)
from training.registry import (
    CHOICE,
    OPTIONS_DECLARED,
    STRATEGIES,
    SWITCH,
    OptionValue,
    StrategyOption,
    option_value_text,
)
from training.text_catalogue import BYTE_LLAMA_SIZE_DEFAULT, BYTE_LLAMA_SIZES, LANGUAGE_MODELS


def experiment_runs_script(*, experiment: Experiment) -> bool:
    """A run of the user's own script (strategy "script"), not of the engine."""
    spec = STRATEGIES.get(experiment.strategy)  # None: a name no longer in the registry
    return spec is not None and spec.user_script


def experiment_script_facts(*, experiment: Experiment) -> list[dict[str, str]]:
    """A script run's rows of the run page's settings, in place of the engine's it does not
    read: its entry point, arguments as a shell would write them, and its code (the upload's
    hash, or the folder on the workers). Empty for the other strategies."""
    if not experiment_runs_script(experiment=experiment):
        return []
    if experiment.reported:  # a script elsewhere: what it ran is on its own machine
        return [{"label": "Reported", "value": "by a script run elsewhere (trainyard.init)"}]
    code = experiment.code
    return [
        {"label": "Entry point", "value": experiment.entrypoint},
        {"label": "Arguments", "value": shlex.join(experiment.args or []) or "none"},
        {"label": "Code", "value": f"sha256 {code.sha256}" if code else experiment.code_path},
    ]


def experiment_language_settings(*, experiment: Experiment) -> dict[str, Any]:
    """A language model's size, window and sequence parallel as it trains with them (a blank
    size or window: the size's default); None each for the other models (the read JSON's). A
    plug-in's language model has its own size and plan: its window alone (None: its build's)."""
    if experiment.model not in LANGUAGE_MODELS:  # (the launch emptied it for a classifier)
        return {"model_size": None, "seq_len": experiment.seq_len, "sequence_parallel": None}
    name = experiment.model_size or BYTE_LLAMA_SIZE_DEFAULT
    size = BYTE_LLAMA_SIZES.get(name)  # None: a size the engine no longer has
    return {
        "model_size": name,
        "seq_len": experiment.seq_len or (size.seq_len if size else None),
        "sequence_parallel": experiment.sequence_parallel,
    }


def experiment_language_facts(*, experiment: Experiment) -> list[dict[str, str]]:
    """The run page's Settings rows of a language model (empty for the other models): its
    size with the engine's line for it, its window, and sequence parallel where it is read."""
    settings = experiment_language_settings(experiment=experiment)
    if settings["model_size"] is None:  # a plug-in's language model: its window, where given
        window = settings["seq_len"]
        return [{"label": "Window", "value": f"{window} bytes", "help": ""}] if window else []
    size = BYTE_LLAMA_SIZES.get(settings["model_size"])
    rows = [
        {"label": "Model size", "value": settings["model_size"], "help": size.help if size else ""},
        {"label": "Window", "value": f"{settings['seq_len']} bytes", "help": ""},
    ]
    if settings["sequence_parallel"] is not None:
        value = "on" if settings["sequence_parallel"] else "off"
        rows.append({"label": "Sequence parallel", "value": value, "help": ""})
    return rows


def experiment_is_active(*, experiment: Experiment) -> bool:
    """Queued or running: it can still be stopped, and its page still listens for events."""
    return experiment.status in ACTIVE_STATUSES


def experiment_duration_seconds(*, experiment: Experiment) -> float | None:
    """From its start to its end, or to now while it runs; None before it started."""
    if experiment.started_at is None:
        return None
    end = experiment.finished_at or timezone.now()
    return (end - experiment.started_at).total_seconds()


def experiment_dataset_label(*, experiment: Experiment) -> str:
    """ "MNIST" for a built-in; else the name, with the image folder for imagefolder."""
    if experiment.dataset in Dataset.values:
        return str(Dataset(experiment.dataset).label)
    if experiment.data_path:
        return f"{experiment.dataset} {experiment.data_path}"
    return experiment.dataset


def experiment_devices_label(*, experiment: Experiment) -> str:
    """ "GPU 0,1", "2 CPU processes on each of 3 machines" or "CPU"."""
    # `processes` and `gpus` are per machine: say so when the run spans several.
    each = f" on each of {experiment.nodes} machines" if experiment.nodes > 1 else ""
    if experiment.gpus:
        return "GPU " + ",".join(str(g) for g in experiment.gpus) + each
    if experiment.strategy in PROCESS_STRATEGIES:
        processes = experiment.processes
        return f"{processes} CPU process{'' if processes == 1 else 'es'}{each}"
    return "CPU"


def experiment_options_read(*, experiment: Experiment) -> list[tuple[StrategyOption, OptionValue]]:
    """Each option its strategy reads, with the value it trains with: the stored one, else
    the option's default (a row from before the option was declared, or made by the admin)."""
    spec = STRATEGIES.get(experiment.strategy)  # None: a name no longer in the registry
    read = []
    for option in spec.options if spec else ():
        value = getattr(experiment, option.name)
        read.append((option, option.default if value is None else value))
    return read


def experiment_option_values(*, experiment: Experiment) -> dict[str, OptionValue | None]:
    """Every declared option by name: what the run trains with where its strategy reads
    it, None where it does not (the read JSON, exports)."""
    values: dict[str, OptionValue | None] = dict.fromkeys(o.name for o in OPTIONS_DECLARED)
    values.update(
        (option.name, value) for option, value in experiment_options_read(experiment=experiment)
    )
    return values


def experiment_options_label(*, experiment: Experiment) -> str:
    """ "PowerSGD, ZeRO-1 optimizer": the options it reads that are not at their default
    (empty when none), in the registry's words."""
    return ", ".join(
        option_value_text(option, value)
        for option, value in experiment_options_read(experiment=experiment)
        if value != option.default
    )


def experiment_strategy_label(*, experiment: Experiment) -> str:
    """ "DistributedDataParallel (PowerSGD)": the strategy and its options off default."""
    label = experiment.get_strategy_display()
    options = experiment_options_label(experiment=experiment)
    return f"{label} ({options})" if options else label


def experiment_option_facts(*, experiment: Experiment) -> list[dict[str, str]]:
    """The run page's rows: every option its strategy reads, as people read it."""
    rows = []
    for option, value in experiment_options_read(experiment=experiment):
        if option.kind == CHOICE:
            text = str(dict(option.choices).get(value, value))
        elif option.kind == SWITCH:
            text = "on" if value else "off"
        else:
            text = str(value)
        rows.append({"name": option.name, "label": option_title(option), "value": text})
    return rows
