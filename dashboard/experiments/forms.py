"""Validation of a launch request, shared by the web form and the JSON API."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core import validators

from dashboard.experiments.models import Experiment, Strategy

STRATEGY_HELP: dict[str, str] = {
    "single": "One process on one device: a GPU when you pick one, else the CPU.",
    "dp": (
        "DataParallel: one process splits each batch across the chosen GPUs and gathers the "
        "results on the first; without GPUs it runs as a plain single CPU process."
    ),
    "ddp": (
        "DistributedDataParallel: one process per rank (torchrun), each on its own shard of the "
        "data, gradients averaged by all-reduce (NCCL on GPUs, Gloo on CPU)."
    ),
}

LIMITS = {
    "epochs": (1, 1000),
    "batch_size": (1, 8192),
    "processes": (1, 256),
    "seed": (0, 2**31 - 1),
}
LR_MAX = 10.0
DEFAULT_CPU_PROCESSES = 2
FIELDS = (
    "name",
    "dataset",
    "strategy",
    "processes",
    "gpus",
    "epochs",
    "batch_size",
    "lr",
    "optimizer",
    "seed",
)


class GpuListField(forms.Field):
    """GPU ids as "0,1" in the form or [0, 1] in JSON; empty means CPU."""

    default_error_messages = {"invalid": "GPU ids must be whole numbers such as 0,1"}

    def to_python(self, value: Any) -> list[int]:
        if value in (None, "", []):
            return []
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        ids: list[int] = []
        for item in items:
            if isinstance(item, bool):
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
            text = str(item).strip()
            if not text.isdigit():
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
            ids.append(int(text))
        if len(set(ids)) != len(ids):
            raise forms.ValidationError("each GPU id may appear once", code="duplicate")
        return ids

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return "" if value is None else str(value)


class ExperimentForm(forms.ModelForm):
    gpus = GpuListField(
        required=False,
        help_text="GPU ids such as 0,1; leave empty to train on the CPU.",
        widget=forms.TextInput(attrs={"placeholder": "empty = CPU"}),
    )

    class Meta:
        model = Experiment
        fields = FIELDS
        widgets = {"lr": forms.NumberInput(attrs={"step": "any"})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["name"].required = False
        # Omitted processes mean "the natural count": one per GPU, else two CPU ranks.
        self.fields["processes"].required = False
        for name, (low, high) in LIMITS.items():
            field = self.fields[name]
            field.min_value = low
            field.max_value = high
            field.validators += [
                validators.MinValueValidator(low),
                validators.MaxValueValidator(high),
            ]
            field.widget.attrs.update(min=low, max=high)

    def clean_lr(self) -> float:
        lr = self.cleaned_data["lr"]
        if not (0 < lr <= LR_MAX):
            raise forms.ValidationError(f"learning rate must be above 0 and at most {LR_MAX}")
        return lr

    def clean(self) -> dict[str, Any]:
        from dashboard.devices.capacity import capacity_check

        data = super().clean() or {}
        strategy, gpus = data.get("strategy"), data.get("gpus", [])
        if strategy is None or self.errors:
            return data
        if strategy != Strategy.DDP:
            data["processes"] = 1
        elif data.get("processes") is None:
            data["processes"] = len(gpus) if gpus else DEFAULT_CPU_PROCESSES
        elif gpus and data["processes"] != len(gpus):
            self.add_error(
                "processes", f"with GPUs, DDP runs one process per GPU: {len(gpus)} for {gpus}"
            )
            return data
        for message in capacity_check(
            strategy=strategy, processes=data.get("processes", 1), gpus=gpus
        ):
            self.add_error("gpus" if gpus else "processes", message)
        if not data.get("name"):
            data["name"] = f"{Strategy(strategy).label} on {data.get('dataset', 'mnist')}"
        return data
