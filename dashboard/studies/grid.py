"""A study request read and expanded: the product of its axes, each cell checked by exactly the
checks one launch gets (POST /api/experiments/: the JSON types, then the launch form), before
anything is stored. One bad cell refuses the whole study, naming the cell.

But one kind of cell is skipped, not refused: a strategy given an option it does not read (a
value other than the option's default), as `strategy [ddp, fsdp] x comm_hook [none, fp16]`
gives fsdp with fp16. Such a cell is a question the grid asked by its shape, not a mistake;
running it at the default would repeat the default's cell under another name. The study says
which cells it skipped and why (``cells_skipped``: worked out again from the axes when read, so
nothing more is stored). A study whose every cell is skipped is refused.

A script run's study may also sweep the script's own arguments (``args.<flag>`` axes:
args_axes.py); its cells need the owner's permission to run scripts, as a launch does (403)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from dashboard.api import ApiError
from dashboard.experiments.core.forms import ExperimentForm
from dashboard.experiments.core.language_fields import LANGUAGE_FIELDS, language_not_read
from dashboard.experiments.models import PROCESS_STRATEGIES
from dashboard.experiments.web.api_launch import (
    launch_form_data,
    launch_payload_check,
    launch_script_fields,
)
from dashboard.studies.args_axes import ARGS_AXIS, args_axis_error, cell_payload, is_args_axis
from dashboard.studies.models import BatchMode
from dashboard.studies.texts import MAX_RUNS, all_skipped_text, runs_text
from training.catalogue import MODEL_DEFAULT
from training.refusals import option_refusals
from training.registry import (
    OPTIONS_DECLARED,
    STRATEGIES,
    STRATEGY_NAMES,
    mesh_shape,
    strategy_get,
)

AXIS_FIELDS = (
    "model", "dataset", "strategy", "processes", "nodes", "batch_size", "lr", "optimizer", "seed",
    # A language model's: "seq_len [64, 128] x model_size [smoke, small]".
    *LANGUAGE_FIELDS,
    # Every strategy option the registry declares: "ddp x comm_hook [none, fp16, powersgd]".
    *(option.name for option in OPTIONS_DECLARED),
)  # fmt: skip
REQUEST_KEYS = ("name", "base", "axes", "target_accuracy", "stop_at_target", "batch_mode")
NAME_MAX = 120


class StudyRefused(Exception):
    """A study that is not launched: the API answers `status` (400; 403 where the owner may not
    launch a cell at all) with these errors, the form shows them."""

    def __init__(
        self,
        message: str,
        errors: dict[str, list[str]],
        *,
        cell: dict[str, Any] | None = None,
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors
        self.cell = cell  # {"index", "values"} of the cell that failed, if one did
        self.status = status


@dataclass(frozen=True)
class StudyRequest:
    name: str
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    target_accuracy: float
    stop_at_target: bool
    batch_mode: str


@dataclass(frozen=True)
class SkippedCell:
    values: dict[str, Any]  # the axes' values of this cell, as asked
    reason: str  # "comm_hook applies to --strategy ddp only, not fsdp"

    def as_dict(self) -> dict[str, Any]:
        return {"values": self.values, "text": cell_values_text(self.values), "reason": self.reason}


@dataclass(frozen=True)
class PlannedRun:
    values: dict[str, Any]  # the axes' values of this cell, as asked
    fields: dict[str, Any]  # the launch fields, as the form cleaned them


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _axes_check(axes: Any, base: dict[str, Any]) -> dict[str, list[str]]:
    if not isinstance(axes, dict):
        return {"axes": ["must be an object of {field: [values]}"]}
    errors: dict[str, list[str]] = {}
    for key, values in axes.items():
        if key not in AXIS_FIELDS and not is_args_axis(key):
            errors[f"axes.{key}"] = [
                f"not an axis; the axes are {', '.join(AXIS_FIELDS)}, and a script run's "
                f"arguments as {ARGS_AXIS}<flag>"
            ]
        elif not isinstance(values, list) or not values:
            errors[f"axes.{key}"] = ["must be a non-empty list of values"]
        elif len(values) > MAX_RUNS:
            errors[f"axes.{key}"] = [f"at most {MAX_RUNS} values"]
        elif len({json.dumps(v, sort_keys=True) for v in values}) < len(values):
            errors[f"axes.{key}"] = ["each value may appear once"]
        elif is_args_axis(key) and (why := args_axis_error(key=key, values=values, base=base)):
            errors[f"axes.{key}"] = [why]
    return errors


def study_request_parse(payload: dict[str, Any]) -> StudyRequest:
    """The study's own keys; the launch fields inside are the cells' to check."""
    errors: dict[str, list[str]] = {
        key: [f"unknown field; the fields are {', '.join(REQUEST_KEYS)}"]
        for key in payload
        if key not in REQUEST_KEYS
    }
    name: Any = payload.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        errors["name"] = [f"a name of 1 to {NAME_MAX} characters is required"]
    base = payload.get("base", {})
    if not isinstance(base, dict):
        errors["base"] = ["must be an object of launch fields"]
    elif "name" in base:
        errors["base.name"] = ["each run is named after the study and its cell"]
    errors.update(_axes_check(payload.get("axes", {}), base if isinstance(base, dict) else {}))
    target: Any = payload.get("target_accuracy")
    if not _number(target) or not 0 < target <= 1:
        errors["target_accuracy"] = ["a test accuracy above 0 and at most 1, e.g. 0.97"]
    if not isinstance(payload.get("stop_at_target", False), bool):
        errors["stop_at_target"] = ["must be true or false"]
    batch_mode = payload.get("batch_mode", BatchMode.PER_PROCESS)
    if batch_mode not in BatchMode.values:
        errors["batch_mode"] = [f"one of {', '.join(BatchMode.values)}"]
    if errors:
        raise StudyRefused("invalid study", errors)
    axes = payload.get("axes", {})
    size = math.prod(len(values) for values in axes.values())
    if size > MAX_RUNS:
        raise StudyRefused(
            f"the axes make {runs_text(size)}; a study has at most {MAX_RUNS}",
            {"axes": [f"{runs_text(size)}, at most {MAX_RUNS}"]},
        )
    return StudyRequest(
        name=name.strip(), base=base, axes=axes, target_accuracy=float(target),
        stop_at_target=payload.get("stop_at_target", False), batch_mode=batch_mode,
    )  # fmt: skip


def world_size_of(fields: dict[str, Any]) -> int:
    """Workers the run spreads over: processes x nodes for process strategies, GPUs for the
    one-process strategies that use several (scaling.experiment_world_size's rule)."""
    if fields["strategy"] in PROCESS_STRATEGIES:
        return max(1, fields.get("processes") or 1) * max(1, fields.get("nodes") or 1)
    if not strategy_get(fields["strategy"]).processes and fields["strategy"] != "single":
        return max(1, len(fields.get("gpus") or []))
    return 1


def _launch_check(
    payload: dict[str, Any], *, owner: Any
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """One launch's checks, as POST /api/experiments/ makes them, in its order: cleaned fields
    (a script run's own among them) or errors; StudyRefused (403) for an owner who may not run
    the cell's script."""
    errors = launch_payload_check(payload)
    if errors:
        return {}, errors
    try:
        script = launch_script_fields(user=owner, payload=payload)
    except ApiError as refused:
        if refused.status == 403:
            raise StudyRefused(refused.message, refused.errors, status=403) from None
        return {}, refused.errors
    # Every strategy, as the API takes them (the study form offers the launch form's).
    form = ExperimentForm(data=launch_form_data(payload), strategies=STRATEGY_NAMES)
    if not form.is_valid():
        return {}, {k: [e["message"] for e in v] for k, v in form.errors.get_json_data().items()}
    return {**form.cleaned_data, **script}, {}


def _cell_check(
    request: StudyRequest, values: dict[str, Any], *, owner: Any
) -> tuple[dict[str, Any], dict]:
    payload = cell_payload(base=request.base, values=values)
    fields, errors = _launch_check(payload, owner=owner)
    if (
        errors
        or request.batch_mode != BatchMode.GLOBAL
        or fields["strategy"] not in PROCESS_STRATEGIES
    ):
        return fields, errors
    if strategy_get(fields["strategy"]).user_script:
        # The engine's batch size is not the script's: its own is in its args, to split itself.
        return {}, {"batch_mode": ["a script run reads no batch size: use per_process"]}
    # The base batch is the global one: each data-parallel slice takes its share; the ranks
    # that split the model (tensor-parallel's, a pipeline's stages) share their slice's batch.
    world, whole = world_size_of(fields), fields["batch_size"]
    slices = mesh_shape(fields["strategy"], world)[0]
    if whole % slices:
        over = f"{world} processes" if slices == world else f"{slices} data-parallel groups"
        return {}, {"batch_size": [f"a global batch of {whole} does not split over {over}"]}
    return _launch_check({**payload, "batch_size": whole // slices}, owner=owner)


def grid_cells(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Each cell's values, in grid order (the product of the axes)."""
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes.values())]


def cell_skip_reason(*, base: dict[str, Any], values: dict[str, Any]) -> str | None:
    """Why the cell is skipped: its strategy does not read an option it gives a value other
    than the default (training.refusals' option_refusals, its "not read" kind). None otherwise,
    and where the cell's types or strategy are wrong: the launch checks refuse those."""
    payload = cell_payload(base=base, values=values)
    form_data = launch_form_data(payload)
    strategy, model = form_data["strategy"], form_data["model"] or MODEL_DEFAULT
    if isinstance(model, str) and isinstance(strategy, str):
        # A language field its model or strategy does not read: as an option's, a question
        # the grid's shape asked (model [simple-cnn, byte-llama] x seq_len [64, 128]).
        language = language_not_read(payload, model=model, strategy=strategy)
        if language:
            return "; ".join(f"{name}: {why}" for name, why in language.items())
    if launch_payload_check(payload) or strategy not in STRATEGIES:
        return None
    read = STRATEGIES[strategy].options
    reasons = [
        f"{option.name} {reason}"
        for option, reason in option_refusals(strategy, values=payload, gpus=[])
        if option not in read
    ]
    return "; ".join(reasons) or None


def cells_skipped(*, base: dict[str, Any], axes: dict[str, list[Any]]) -> list[SkippedCell]:
    """The study's skipped cells, in grid order (see the module docstring)."""
    skipped = []
    for values in grid_cells(axes):
        reason = cell_skip_reason(base=base, values=values)
        if reason is not None:
            skipped.append(SkippedCell(values, reason))
    return skipped


def cell_values_text(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in values.items()) or "the base config"


def study_plan(*, owner: Any, request: StudyRequest) -> list[PlannedRun]:
    """The study's runs in grid order, each checked as `owner`'s launch; raises StudyRefused
    naming the first bad cell. Cells that the launch checks make identical (the processes of a
    one-process strategy are normalised to 1) are one run; skipped cells (``cells_skipped``)
    are none."""
    grid = grid_cells(request.axes)
    planned: dict[str, PlannedRun] = {}
    for index, values in enumerate(grid, start=1):
        if cell_skip_reason(base=request.base, values=values) is not None:
            continue
        fields, errors = _cell_check(request, values, owner=owner)
        if errors:
            where = f"cell {index} of {len(grid)} ({cell_values_text(values)})"
            raise StudyRefused(
                f"{where} is not a valid launch; nothing was created",
                errors,
                cell={"index": index, "values": values},
            )
        fields.pop("name", None)
        planned.setdefault(
            json.dumps(fields, sort_keys=True, default=str), PlannedRun(values, fields)
        )
    if not planned:
        skipped = cells_skipped(base=request.base, axes=request.axes)
        raise StudyRefused(
            all_skipped_text(len(skipped)), {"axes": [cell.reason for cell in skipped[:3]]}
        )
    return list(planned.values())
