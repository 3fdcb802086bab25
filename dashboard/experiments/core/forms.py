"""Validation of a launch request, shared by the web form and the JSON API."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core import validators

from dashboard.devices.capacity import capacity_check
from dashboard.experiments.core.access import script_allowed
from dashboard.experiments.core.backends import backend_refusals
from dashboard.experiments.core.catalogue_checks import (
    data_path_normalise,
    launch_catalogue_check,
    pipeline_stage_limit,
)
from dashboard.experiments.core.catalogue_options import (
    dataset_choices,
    folder_choices,
    model_choices,
)
from dashboard.experiments.core.language_fields import (
    language_clean,
    model_size_field,
    run_language,
    seq_len_help,
    sequence_parallel_field,
    stage_count,
)
from dashboard.experiments.models import Backend, Experiment, option_title
from dashboard.texts import words_joined
from training.catalogue import MODEL_DEFAULT
from training.refusals import (
    RULE_PER_GPU,
    option_refusals,
    pipeline_refusals,
    plural,
    strategy_refusals,
)
from training.registry import (
    COUNT,
    OPTIONS_DECLARED,
    REGISTRY,
    SWITCH,
    StrategyOption,
    StrategySpec,
    global_batch_size,
    global_batch_words,
    strategy_get,
)
from training.text_catalogue import SEQ_LEN_BOUNDS

LIMITS = {
    "epochs": (1, 1000),
    "batch_size": (1, 8192),
    "processes": (1, 256),
    "nodes": (1, 64),
    "seed": (0, 2**31 - 1),
    "time_limit_minutes": (1, 366 * 24 * 60),
    "seq_len": SEQ_LEN_BOUNDS,
}
LR_MAX = 10.0
DEFAULT_CPU_PROCESSES = 2
FIELDS = (
    "name",
    "model",
    "dataset",
    "data_path",
    # A language model's (byte-llama): its size preset, window and tensor parallel's sequence
    # split, as it trains with them (core/language_fields.py); empty for the other models.
    "model_size",
    "seq_len",
    "sequence_parallel",
    "strategy",
    "processes",
    "nodes",
    "machines",
    "gpus",
    "epochs",
    "batch_size",
    "lr",
    "optimizer",
    "seed",
    # What runs it (core/backends.py): the workers, or a Slurm job in a partition, time-limited.
    "backend",
    "partition",
    "time_limit_minutes",
    # Every strategy option the registry declares (ZeRO's stage, DDP's comm hook, ...).
    *(option.name for option in OPTIONS_DECLARED),
)


# A script run's own fields, which no other strategy reads: stored beside the form's, checked by
# scripts/launch.py (the launch page's are scripts/form.py's).
SCRIPT_FIELDS = ("entrypoint", "args", "code", "code_path")
# The strategies the launch form (and a study's) offers everyone: the engine's. A user's own
# script is offered besides to those allowed to run one (launch_form_strategies); the API takes
# every strategy. Their one home.
FORM_STRATEGIES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY if not spec.user_script)
SCRIPT_STRATEGIES: tuple[str, ...] = tuple(spec.name for spec in REGISTRY if spec.user_script)


def launch_form_strategies(*, user: Any) -> tuple[str, ...]:
    """What the launch page offers `user`: the engine's strategies, and a script of their own
    where they may run one (a script runs arbitrary code as the worker's user)."""
    return FORM_STRATEGIES + (SCRIPT_STRATEGIES if script_allowed(user=user) else ())


# The engine's settings, which a script run leaves at their defaults: the script does not read
# them (it has its own, in its arguments).
ENGINE_ONLY_DEFAULTS: dict[str, Any] = {
    name: Experiment._meta.get_field(name).get_default()
    for name in ("model", "dataset", "data_path", "epochs", "batch_size", "lr", "optimizer")
}


def experiment_clone_fields(*, source: Experiment) -> dict[str, Any]:
    """The launch fields of a copy of `source`: the admin's clone, and the form it prefills (a
    script run's own fields too: the code, entry point and arguments it ran)."""
    fields = {name: getattr(source, name) for name in (*FIELDS, *SCRIPT_FIELDS)}
    fields["name"] = f"{source.name} (again)"[:200]
    return fields


# One machine never has more GPUs than this; the bound also keeps the checks on the list cheap.
MAX_GPU_IDS = 64
GPU_ID_MAX_DIGITS = 6
MACHINE_NAME_MAX_CHARS = 255  # WorkerMachine.hostname


def spanning_labels(strategies: tuple[str, ...] = FORM_STRATEGIES) -> str:
    """Those of `strategies` that can span machines (training/registry.py), for people."""
    return words_joined([spec.label for spec in REGISTRY if spec.nodes and spec.name in strategies])


class CommaListField(forms.Field):
    """A list as "a,b" in the form or a JSON list; empty is the empty list."""

    def _items(self, value: Any) -> list[Any] | None:
        """The items, or None when the value is no list at all."""
        items = value.split(",") if isinstance(value, str) else value
        return list(items) if isinstance(items, list | tuple) else None

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return "" if value is None else str(value)


class MachineListField(CommaListField):
    """Worker names to pin a run to, as "a,b" in the form or ["a", "b"] in JSON; empty leaves
    the machines to placement."""

    default_error_messages = {"invalid": "machines are worker names such as host-a,host-b"}

    def to_python(self, value: Any) -> list[str]:
        if value in (None, "", []):
            return []
        items = self._items(value)
        if items is None or not all(isinstance(i, str) for i in items):
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        names = [item.strip() for item in items]
        if len(names) > LIMITS["nodes"][1] or not all(names):
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        if any(len(name) > MACHINE_NAME_MAX_CHARS for name in names):
            raise forms.ValidationError(
                f"a worker name has at most {MACHINE_NAME_MAX_CHARS} characters", code="too_long"
            )
        if len(set(names)) != len(names):
            raise forms.ValidationError("each machine may appear once", code="duplicate")
        return names


class GpuListField(CommaListField):
    """GPU ids as "0,1" in the form or [0, 1] in JSON; empty means CPU."""

    default_error_messages = {"invalid": "GPU ids must be whole numbers such as 0,1"}

    def to_python(self, value: Any) -> list[int]:
        if value in (None, "", []):
            return []
        items = self._items(value)
        if items is None:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        if len(items) > MAX_GPU_IDS:
            raise forms.ValidationError(f"at most {MAX_GPU_IDS} GPU ids", code="too_many")
        ids: list[int] = []
        for item in items:
            if isinstance(item, bool):
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
            text = str(item).strip()
            # isdigit() alone lets "²" through, which int() then refuses.
            if not (text.isascii() and text.isdigit() and len(text) <= GPU_ID_MAX_DIGITS):
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
            ids.append(int(text))
        if len(set(ids)) != len(ids):
            raise forms.ValidationError("each GPU id may appear once", code="duplicate")
        return ids


def option_field(option: StrategyOption) -> forms.Field:
    """The launch field of a declared option, typed by its kind and in the registry's words:
    a select with "default (X)" first, a checkbox, or a number within the bounds. Empty (None)
    is not given: the strategies that read it train with its default."""
    common: dict[str, Any] = {
        "required": False,
        "label": option_title(option),
        "help_text": option.help,
    }
    if option.kind == SWITCH:
        return forms.BooleanField(**common)
    if option.kind == COUNT:
        low, high = option.bounds
        field = forms.IntegerField(
            min_value=low,
            max_value=high,
            widget=forms.NumberInput(attrs={"placeholder": f"default ({option.default})"}),
            **common,
        )
        # Said in one way whatever is wrong: not a number, or out of bounds.
        field.error_messages.update(
            invalid=option.invalid_text(),
            min_value=f"{option.invalid_text()}, not %(value)s",
            max_value=f"{option.invalid_text()}, not %(value)s",
        )
        return field
    field = forms.TypedChoiceField(
        choices=[("", f"default ({option.default})"), *option.choices],
        coerce=type(option.default),
        empty_value=None,
        **common,
    )
    field.error_messages["invalid_choice"] = f"{option.invalid_text()}, not %(value)s"
    return field


class ExperimentForm(forms.ModelForm):
    gpus = GpuListField(
        required=False,
        help_text="GPU ids such as 0,1; leave empty to train on the CPU.",
        widget=forms.TextInput(attrs={"placeholder": "empty = CPU"}),
    )
    machines = MachineListField(
        required=False,
        help_text="Worker names such as host-a,host-b to run on; empty: any that are free.",
        widget=forms.TextInput(attrs={"placeholder": "empty = any free machines"}),
    )

    class Meta:
        model = Experiment
        fields = FIELDS
        widgets = {"lr": forms.NumberInput(attrs={"step": "any"})}

    def __init__(
        self, *args: Any, strategies: tuple[str, ...] = FORM_STRATEGIES, **kwargs: Any
    ) -> None:
        """``strategies``: those it takes (the page's: FORM_STRATEGIES; the API's: every one)."""
        super().__init__(*args, **kwargs)
        self.strategies = strategies
        strategy = self.fields["strategy"]
        strategy.choices = [(v, label) for v, label in strategy.choices if v in strategies]
        self.fields["name"].required = False
        self.fields["model"].required = False  # simple-cnn
        # Omitted processes mean "the natural count": one per GPU, else two CPU ranks.
        self.fields["processes"].required = False
        # Omitted nodes mean one machine, or as many as are pinned.
        self.fields["nodes"].required = False
        self.fields["backend"].required = False  # core/backends.py's default
        self.fields["nodes"].help_text = (
            f"Machines the run spans ({spanning_labels(strategies)} only); Processes are the "
            "ranks on each machine."
        )
        for option in OPTIONS_DECLARED:
            self.fields[option.name] = option_field(option)
        self.fields["model_size"] = model_size_field()
        self.fields["sequence_parallel"] = sequence_parallel_field()
        self.fields["seq_len"].label = "Window (bytes)"
        self.fields["seq_len"].help_text = seq_len_help()
        for name, (low, high) in LIMITS.items():
            field = self.fields[name]
            field.min_value = low
            field.max_value = high
            field.validators += [
                validators.MinValueValidator(low),
                validators.MaxValueValidator(high),
            ]
            field.widget.attrs.update(min=low, max=high)

    @property
    def option_fields(self) -> list[forms.BoundField]:
        """The strategy options' fields, in the registry's order (the page shows each for the
        strategies that read it, from the page facts)."""
        return [self[option.name] for option in OPTIONS_DECLARED]

    def options_apply(self, options: dict[str, Any]) -> None:
        """Offer what the online workers have (catalogue_options.launch_options), for the page;
        the API and studies send names, which the launch checks judge, not these lists."""
        self.fields["model"].widget = forms.Select(choices=model_choices(options))
        self.fields["dataset"].widget = forms.Select(choices=dataset_choices(options))
        self.fields["data_path"].widget = forms.Select(choices=folder_choices(options))
        self.fields["data_path"].label = "Folder"

    def partitions_apply(self, partitions: list[Any]) -> None:
        """Offer the Slurm cluster's partitions (selectors.slurm_launch_facts, for the page; the
        API sends a name, which the launch checks judge), the default one first."""
        default = next((p.name for p in partitions if p.default), "")
        first = f"default ({default})" if default else "the cluster's default"
        self.fields["partition"].widget = forms.Select(
            choices=[("", first), *((p.name, p.describe()) for p in partitions)]
        )

    def _catalogue_clean(self, data: dict[str, Any]) -> bool:
        """The model, dataset and image folder against the online workers' reports."""
        data["model"] = data.get("model") or MODEL_DEFAULT
        data["data_path"] = data_path_normalise(
            dataset=data["dataset"], data_path=data.get("data_path")
        )
        strategy, accumulate = data["strategy"], data.get("accumulate") or 1
        world = data["processes"] * data["nodes"]
        made = global_batch_words(
            strategy, batch_size=data["batch_size"], accumulate=accumulate, world=world
        )
        refusals = launch_catalogue_check(
            model=data["model"], dataset=data["dataset"], data_path=data["data_path"],
            strategy=strategy, nodes=data["nodes"], machines=data["machines"],
            global_batch=global_batch_size(
                strategy, batch_size=data["batch_size"], accumulate=accumulate, world=world
            ),
            batch_made=made,
        )  # fmt: skip
        for field, messages in refusals.items():
            for message in messages:
                self.add_error(field, message)
        return not refusals

    def _engine_fields_clean(self, data: dict[str, Any], spec: StrategySpec) -> None:
        """A script run reads none of the engine's settings: one given off its default is
        refused on its field (as an option its strategy does not read is), the others are
        stored at their defaults."""
        for name, default in ENGINE_ONLY_DEFAULTS.items():
            if data.get(name) in (None, "", default):
                data[name] = default
            elif name not in self.errors:
                self.add_error(
                    name,
                    f"{spec.label} does not read it: give your script its settings in `args`",
                )

    def _backend_clean(self, data: dict[str, Any]) -> bool:
        """The backend (empty: the default) and the fields only one of them reads."""
        for field, message in backend_refusals(data).items():
            self.add_error(field, message)
        return not self.errors

    def clean_lr(self) -> float:
        lr = self.cleaned_data["lr"]
        if not (0 < lr <= LR_MAX):
            raise forms.ValidationError(f"learning rate must be above 0 and at most {LR_MAX}")
        return lr

    def _nodes_clean(self, data: dict[str, Any], spec: StrategySpec) -> bool:
        """Machines and nodes agree, and the strategy can span them; False when refused."""
        machines = data.setdefault("machines", data.get("machines") or [])
        if data.get("nodes") is None:
            data["nodes"] = len(machines) or 1
        if machines and len(machines) != data["nodes"]:
            self.add_error(
                "machines",
                f"name one machine per node: {plural(len(machines), 'machine')} named for "
                f"{plural(data['nodes'], 'node')}",
            )
            return False
        if data["nodes"] > 1 and not spec.nodes:
            self.add_error(
                "nodes",
                f"{spec.label} runs on one machine; only {spanning_labels(self.strategies)} span "
                "several machines (torchrun's rendezvous)",
            )
            return False
        return True

    def _options_clean(self, data: dict[str, Any], spec: StrategySpec, gpus: list[int]) -> None:
        """training.refusals' option_refusals, as the CLI asks them: a value other than the default
        for a strategy that does not read the option, a GPU-only value on the CPU; each said on
        its field. Then each option holds what the run trains with where the strategy reads it
        and None elsewhere: a value left at its default is dropped, not refused, as the user
        switches strategies."""
        given = {option.name: data.get(option.name) for option in OPTIONS_DECLARED}
        for option, reason in option_refusals(spec.name, values=given, gpus=gpus):
            self.add_error(option.name, reason)
        for option in OPTIONS_DECLARED:
            value = given[option.name]
            if option.name not in self.errors:
                read = option in spec.options
                data[option.name] = (option.default if value is None else value) if read else None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        strategy, gpus = data.get("strategy"), data.get("gpus", [])
        # The options are judged with the other fields' mistakes, not a round after them (a
        # GPU-only value needs the GPU ids, though).
        if strategy is not None and "gpus" not in self.errors:
            self._options_clean(data, strategy_get(strategy), gpus)
        if strategy is None or self.errors:
            return data
        spec = strategy_get(strategy)
        if spec.user_script:
            self._engine_fields_clean(data, spec)
        if not spec.processes:
            data["processes"] = 1
        elif data.get("processes") is None:
            data["processes"] = len(gpus) if gpus else DEFAULT_CPU_PROCESSES
        # Processes that do not match the GPUs are refused on the processes field, where the fix is.
        for refusal in strategy_refusals(strategy, processes=data["processes"], gpus=gpus):
            if refusal.rule == RULE_PER_GPU:
                self.add_error("processes", refusal.message)
                return data
        model = data.get("model") or MODEL_DEFAULT
        for name, message in language_clean(data, spec=spec, model=model):
            self.add_error(name, message)  # (add_error drops the field from cleaned_data)
        if self.errors:
            return data
        stages = (
            stage_count(data, model=model) or pipeline_stage_limit(model=model)
            if spec.stages and data["processes"] >= 2
            else None
        )
        for refusal in pipeline_refusals(
            strategy, processes=data["processes"], batch_size=data.get("batch_size") or 1,
            microbatches=data.get("microbatches"), schedule=data.get("pipeline_schedule"),
            stages=stages, language=run_language(model=model, dataset=data.get("dataset") or ""),
        ):  # fmt: skip
            self.add_error(refusal.field, refusal.message)
        if not self._nodes_clean(data, spec) or not self._backend_clean(data) or self.errors:
            return data
        # The workers' catalogue and devices judge a run for them; a Slurm run's partition is
        # asked once the form is valid (services.experiment_launch_refusals).
        on_workers = data["backend"] == Backend.CELERY
        # A script run trains no model of the catalogue: nothing there to look for.
        if on_workers and not spec.user_script and not self._catalogue_clean(data):
            return data
        data["model"] = data.get("model") or MODEL_DEFAULT
        # A strategy that cannot run without GPUs is refused on the GPU field, where the fix is.
        needs_gpus = gpus or spec.min_gpus
        messages = capacity_check(
            strategy=strategy,
            processes=data["processes"],
            gpus=gpus,
            nodes=data["nodes"],
            machines=data["machines"],
        )
        # Said where the fix is: the pinned machines, the count of machines, else the devices.
        field = "machines" if data["machines"] else "nodes" if data["nodes"] > 1 else None
        for message in messages if on_workers else []:
            self.add_error(field or ("gpus" if needs_gpus else "processes"), message)
        if not data.get("name") and spec.user_script:
            data["name"] = spec.label  # scripts/launch.py names it after its entry point
        elif not data.get("name"):
            data["name"] = f"{spec.label} on {data.get('dataset', 'mnist')}"
            if data["model"] != MODEL_DEFAULT:
                data["name"] = f"{data['model']}, {data['name']}"[:200]
        return data
