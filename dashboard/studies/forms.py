"""The study form (/studies/new/): a scaling-study preset or a general axes editor, turned into
the same request POST /api/studies/ takes; the runs' own checks are the launch's (grid.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms

from dashboard.experiments.core.catalogue_options import (
    dataset_choices,
    folder_choices,
    model_choices,
)
from dashboard.experiments.core.forms import FORM_STRATEGIES
from dashboard.experiments.models import Dataset, Optimizer, option_title
from dashboard.studies.grid import AXIS_FIELDS, NAME_MAX
from dashboard.studies.models import BatchMode
from dashboard.studies.texts import (
    AXES_HELP,
    BATCH_MODE_HELP,
    MODEL_HELP,
    PRESET_HELP,
    PROCESS_COUNTS_HELP,
    STOP_AT_TARGET_HELP,
    TARGET_DEFAULT,
    TARGET_HELP,
)
from training.catalogue import MODEL_DEFAULT
from training.registry import COUNT, OPTIONS_DECLARED, REGISTRY, StrategyOption
from training.text_catalogue import BYTE_LLAMA_SIZES

MODE_SCALING, MODE_AXES = "scaling", "axes"
SWITCH_WORDS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}


def switch_parse(text: str) -> bool:
    """ "true" or "false" (also on/off, yes/no): a switch's value in the axes editor."""
    try:
        return SWITCH_WORDS[text.lower()]
    except KeyError:
        raise ValueError(text) from None


def option_placeholder(option: StrategyOption) -> str:
    """A strategy option's axis as an example: "none, fp16, powersgd", "false, true", "1, 2"."""
    if option.kind == COUNT:
        return f"{option.default}, {option.default * 2}"
    return ", ".join(str(value).lower() for value in option.values[:3])


OPTIONS = {option.name: option for option in OPTIONS_DECLARED}
# How the axes editor reads each field's comma-separated values; a strategy option's as its
# values are typed (a switch by switch_parse).
AXIS_TYPES: dict[str, Callable[[str], Any]] = {
    "model": str, "dataset": str, "strategy": str, "processes": int, "nodes": int,
    "batch_size": int, "lr": float, "optimizer": str, "seed": int,
    "model_size": str, "seq_len": int, "sequence_parallel": switch_parse,
    **{name: switch_parse if isinstance(o.default, bool) else type(o.default)
       for name, o in OPTIONS.items()},
}  # fmt: skip
AXIS_LABELS = {
    "lr": "Learning rate", "processes": "Processes (per node)", "seq_len": "Window (seq_len)",
    **{name: option_title(option) for name, option in OPTIONS.items()},
}  # fmt: skip
AXIS_PLACEHOLDERS = {
    "model": "simple-cnn, resnet18", "dataset": "mnist, fashion-mnist",
    "strategy": "single, ddp", "processes": "2, 4", "nodes": "1", "batch_size": "32, 64",
    "lr": "0.001, 0.01", "optimizer": "adam, sgd", "seed": "1, 2",
    # A language model's (byte-llama's sizes and windows).
    "model_size": ", ".join(list(BYTE_LLAMA_SIZES)[:2]), "seq_len": "64, 128",
    "sequence_parallel": "true, false",
    **{name: option_placeholder(option) for name, option in OPTIONS.items()},
}  # fmt: skip
VALUE_NOUNS: dict[Callable[[str], Any], str] = {
    int: "a whole number",
    float: "a number",
    switch_parse: "true or false",
}


def values_parse(text: str, kind: Callable[[str], Any]) -> list[Any]:
    """'1, 2' -> [1, 2]; raises ValidationError naming the value that is not a `kind`."""
    values: list[Any] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            values.append(kind(part))
        except ValueError:
            noun = VALUE_NOUNS.get(kind, "a value")
            raise forms.ValidationError(f"{part!r} is not {noun}") from None
    return values


class StudyForm(forms.Form):
    name = forms.CharField(max_length=NAME_MAX)
    # Names the workers report; each cell's launch checks judge them (what no worker has).
    model = forms.CharField(
        initial=MODEL_DEFAULT, max_length=200, required=False, help_text=MODEL_HELP
    )
    dataset = forms.CharField(initial=Dataset.MNIST, max_length=100)
    data_path = forms.CharField(
        required=False, max_length=1000, label="Image folder",
        help_text="With dataset imagefolder: the folder on the worker.",
    )  # fmt: skip
    epochs = forms.IntegerField(initial=1, min_value=1, max_value=1000)
    batch_size = forms.IntegerField(initial=64, min_value=1, max_value=8192)
    lr = forms.FloatField(initial=0.001, label="Learning rate")
    optimizer = forms.ChoiceField(choices=Optimizer.choices, initial=Optimizer.ADAM)
    target_accuracy = forms.FloatField(
        initial=TARGET_DEFAULT, min_value=0.0001, max_value=1.0, help_text=TARGET_HELP
    )
    stop_at_target = forms.BooleanField(required=False, help_text=STOP_AT_TARGET_HELP)
    batch_mode = forms.ChoiceField(
        choices=BatchMode.choices, initial=BatchMode.PER_PROCESS, widget=forms.RadioSelect
    )
    mode = forms.ChoiceField(
        choices=[(MODE_SCALING, "Scaling study"), (MODE_AXES, "Any axes")],
        initial=MODE_SCALING,
        widget=forms.RadioSelect,
    )
    strategies = forms.MultipleChoiceField(
        # A study's runs are the launch form's: a user's own script is not offered there yet.
        choices=[(spec.name, spec.label) for spec in REGISTRY if spec.name in FORM_STRATEGIES],
        initial=["single", "ddp"],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=PRESET_HELP,
    )
    process_counts = forms.CharField(
        initial="2", required=False, label="Process counts", help_text=PROCESS_COUNTS_HELP
    )
    seeds = forms.CharField(initial="1, 2", required=False, label="Seeds")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key in AXIS_FIELDS:
            self.fields[f"axis_{key}"] = forms.CharField(
                required=False,
                label=AXIS_LABELS.get(key, key.replace("_", " ").capitalize()),
                widget=forms.TextInput(attrs={"placeholder": AXIS_PLACEHOLDERS[key]}),
                # A strategy option's help is the registry's; the cells of strategies that do
                # not read it are skipped (grid.py).
                help_text=OPTIONS[key].help if key in OPTIONS else "",
            )
        self.fields["mode"].help_text = AXES_HELP

    def options_apply(self, options: dict[str, Any]) -> None:
        """Offer what the online workers have, as the launch form does (the same lists,
        catalogue_options.launch_options); each cell's launch checks still judge the names."""
        self.fields["model"].widget = forms.Select(choices=model_choices(options))
        self.fields["dataset"].widget = forms.Select(choices=dataset_choices(options))
        self.fields["data_path"].widget = forms.Select(choices=folder_choices(options))

    @property
    def batch_mode_help(self) -> list[tuple[str, str, str]]:
        return [
            (value, label, BATCH_MODE_HELP[BatchMode(value)]) for value, label in BatchMode.choices
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        axes: dict[str, list[Any]] = {}
        typed: dict[str, Callable[[str], Any]]
        if data.get("mode") == MODE_SCALING:
            sources = {"strategy": "strategies", "processes": "process_counts", "seed": "seeds"}
            typed = {"processes": int, "seed": int}
        else:
            sources = {key: f"axis_{key}" for key in AXIS_FIELDS}
            typed = AXIS_TYPES
        for axis, field in sources.items():
            raw = data.get(field)
            try:
                values = (
                    list(raw)
                    if isinstance(raw, list)
                    else values_parse(raw or "", typed.get(axis, str))
                )
            except forms.ValidationError as exc:
                self.add_error(field, exc)
                continue
            if values:
                axes[axis] = values
        if data.get("mode") == MODE_SCALING and "strategy" not in axes:
            self.add_error("strategies", "choose at least one strategy")
        data["axes"] = axes
        return data

    def payload(self) -> dict[str, Any]:
        """The request POST /api/studies/ takes."""
        data = self.cleaned_data
        keys = ("model", "dataset", "epochs", "batch_size", "lr", "optimizer")
        base = {key: data[key] for key in keys}
        base["model"] = base["model"] or MODEL_DEFAULT
        if data.get("data_path"):
            base["data_path"] = data["data_path"]
        return {
            "name": data["name"], "base": base, "axes": data["axes"],
            "target_accuracy": data["target_accuracy"], "stop_at_target": data["stop_at_target"],
            "batch_mode": data["batch_mode"],
        }  # fmt: skip
