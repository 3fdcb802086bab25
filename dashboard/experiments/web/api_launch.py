"""The launch body of POST /api/experiments/ (a study's grid checks its runs with it too): each
field's JSON type, the checks made before the launch form sees a payload, and the body as the
docs show it (LaunchIn), derived from the same types, the model's choices and help and the
form's bounds, so that the docs say what the checks do. A script run's own fields (its code,
entry point and arguments) are checked by scripts/launch.py, which the form does not know of.
The route itself is api.py's.
"""

from __future__ import annotations

import json
from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field, create_model

from dashboard.api import ApiError
from dashboard.experiments.core.access import script_allowed
from dashboard.experiments.core.forms import FIELDS, LIMITS, LR_MAX, MAX_GPU_IDS, SCRIPT_FIELDS
from dashboard.experiments.core.language_fields import LANGUAGE_FIELDS, language_not_read
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.models import Experiment
from dashboard.experiments.scripts.launch import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    ScriptRefused,
    script_fields_given,
    script_launch_fields,
)
from training.catalogue import MODEL_DEFAULT
from training.registry import (
    COUNT,
    OPTIONS_DECLARED,
    STRATEGIES,
    SWITCH,
    StrategyOption,
    option_strategies,
)
from training.text_catalogue import BYTE_LLAMA_SIZES

# JSON types each field accepts; booleans are never numbers here (but a switch's values).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "model": (str,),
    "dataset": (str,),
    "data_path": (str,),
    # A language model's (byte-llama): its size preset, window in bytes, sequence parallel.
    "model_size": (str,),
    "seq_len": (int,),
    "sequence_parallel": (bool,),
    "strategy": (str,),
    "processes": (int,),
    "nodes": (int,),
    "machines": (list,),
    "gpus": (list,),
    "epochs": (int,),
    "batch_size": (int,),
    "lr": (int, float),
    "optimizer": (str,),
    "seed": (int,),
    # What runs it: "celery" (the workers) or "slurm" (a batch job: its partition, time limit).
    "backend": (str,),
    "partition": (str,),
    "time_limit_minutes": (int,),
    # The strategy options (training/registry.py), typed as their defaults: a switch true or
    # false, a count an integer, a choice its values' type (ZeRO's stage 1, a comm hook "fp16").
    **{option.name: (type(option.default),) for option in OPTIONS_DECLARED},
    # A script run's own (strategy "script"): its file, its arguments, and its code, an upload's
    # id or a folder on the workers.
    "entrypoint": (str,),
    "args": (list,),
    "code": (int,),
    "code_path": (str,),
}
# Fields where null means "the default for the strategy" (an option: not given).
NULLABLE_FIELDS = frozenset(
    {
        "processes",
        "nodes",
        "data_path",
        "backend",  # null: the server's default (core/backends.py)
        "time_limit_minutes",  # null: the partition's
        *LANGUAGE_FIELDS,  # null: the size's default (sequence parallel's: on)
        *(option.name for option in OPTIONS_DECLARED),
        *(name for name in SCRIPT_FIELDS if name != "args"),
    }
)
TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    bool: "true or false",
}
# Bounds checked before the form sees a value (see launch_payload_bounds_check).
MAX_JSON_INT = 2**63 - 1
MAX_STRING_CHARS = 200
MAX_PATH_CHARS = 1000  # Experiment's columns of these paths
PATH_FIELDS = ("data_path", "entrypoint", "code_path")
SCRIPT_NOT_ALLOWED = (
    "a script run needs the permission experiments.run_script (it runs arbitrary code on the "
    "workers): ask an administrator"
)
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS_DECLARED}
DEFAULT_STRATEGY = str(Experiment._meta.get_field("strategy").get_default())


def _launch_field(name: str, allowed: tuple[type, ...]) -> tuple[Any, Any]:
    """One launch field as the docs show it: its JSON type, the model's choices and help."""
    kind: Any = {str: str, int: int, float: float, list: list[int], bool: bool}[allowed[-1]]
    if name in ("machines", "args"):
        kind = list[str]  # worker names; a script's arguments
    if name in NULLABLE_FIELDS:
        kind = kind | None
    if name in OPTIONS_BY_NAME:
        return kind, _option_schema_field(OPTIONS_BY_NAME[name])
    try:
        field = Experiment._meta.get_field(name)
    except LookupError:
        return kind, None  # a field the form adds (the docs say only its type)
    extra: dict[str, Any] = {"enum": [value for value, _ in field.choices]} if field.choices else {}
    if extra and name in NULLABLE_FIELDS:
        extra["enum"].append(None)  # the enum sits beside anyOf: null must be one of it too
    if not extra:
        extra = _launch_bounds(name)
    # Every field may be omitted (the form's default), the name included.
    default = field.get_default() if field.has_default() else None
    if name in NULLABLE_FIELDS:
        default = None  # decided by the strategy and the GPUs (data_path: no image folder)
    why = str(field.help_text) or None
    return kind, Field(default, description=why, json_schema_extra=extra or None)


def _option_schema_field(option: StrategyOption) -> Any:
    """A strategy option as the docs show it: the registry's help, the strategies that read
    it, its values (null: not given) or bounds."""
    readers = option_strategies(option)
    where = f"read by {', '.join(readers)}" if readers else "no strategy reads it yet"
    extra: dict[str, Any] = {}
    if option.kind == COUNT:
        extra = {"minimum": option.bounds[0], "maximum": option.bounds[1]}
    elif option.kind != SWITCH:
        extra = {"enum": [*option.values, None]}  # beside anyOf: null is one of them too
    why = f"{option.help} ({where}; default {json.dumps(option.default)}; null: not given)"
    return Field(None, description=why, json_schema_extra=extra or None)


def _launch_bounds(name: str) -> dict[str, Any]:
    """The form's bounds of one field (forms.LIMITS, LR_MAX) and the API's string cap."""
    if name in LIMITS:
        low, high = LIMITS[name]
        return {"minimum": low, "maximum": high}
    if name == "lr":
        return {"exclusiveMinimum": 0, "maximum": LR_MAX}
    if name == "model_size":  # the engine's presets; null or blank: the default
        return {"enum": [*BYTE_LLAMA_SIZES, "", None]}
    if name == "args":  # as scripts/launch.py's args_error bounds them
        return {"maxItems": MAX_ARGS, "items": {"type": "string", "maxLength": MAX_ARG_CHARS}}
    if FIELD_TYPES[name] == (str,):  # as launch_payload_bounds_check caps them
        return {"maxLength": MAX_PATH_CHARS if name in PATH_FIELDS else MAX_STRING_CHARS}
    return {}


# The launch body for the docs only, derived from FIELD_TYPES (the API's type check) and the
# model; the checks themselves stay in launch_payload_check and the launch form.
class Closed(Schema):
    model_config = ConfigDict(extra="forbid")  # an unknown field is refused


LaunchIn: type[Schema] = create_model(  # type: ignore[call-overload]
    "LaunchIn",
    __base__=Closed,
    **{name: _launch_field(name, allowed) for name, allowed in FIELD_TYPES.items()},
)


def launch_payload_check(payload: dict[str, Any]) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    for key in payload:
        if key not in FIELD_TYPES:
            errors[key] = [f"unknown field; the fields are {', '.join(FIELD_TYPES)}"]
    for key, allowed in FIELD_TYPES.items():
        if key not in payload or (key in NULLABLE_FIELDS and payload[key] is None):
            continue
        value = payload[key]
        if isinstance(value, bool) != (allowed == (bool,)) or not isinstance(value, allowed):
            errors[key] = [f"must be {TYPE_NAMES[allowed[-1]]}"]  # (int, float): a number
    gpus = payload.get("gpus")
    if isinstance(gpus, list) and any(isinstance(g, bool) or not isinstance(g, int) for g in gpus):
        errors["gpus"] = ["must be a list of integer GPU ids"]
    for key, why in launch_payload_bounds_check(payload).items():
        errors.setdefault(key, why)
    model, strategy = payload.get("model") or MODEL_DEFAULT, payload.get("strategy")
    if isinstance(model, str) and isinstance(strategy or DEFAULT_STRATEGY, str):
        found = language_not_read(payload, model=model, strategy=strategy or DEFAULT_STRATEGY)
        for key, reason in found.items():
            errors.setdefault(key, [reason])
    strategy = payload.get("strategy", DEFAULT_STRATEGY)
    if isinstance(strategy, str) and not launch_runs_script(payload):
        not_read = f"only a script run reads it (strategy script), not {strategy}"
        for key in script_fields_given(payload=payload):
            errors.setdefault(key, [not_read])
    return errors


def launch_runs_script(payload: dict[str, Any]) -> bool:
    """Whether the body launches a user's own script (strategy omitted: the default's)."""
    name = payload.get("strategy", DEFAULT_STRATEGY)
    spec = STRATEGIES.get(name) if isinstance(name, str) else None
    return spec is not None and spec.user_script


def launch_script_fields(*, user: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A script run's own fields to store ({} for the other strategies), its name too where
    none is given: 403 for a user who may not run scripts, 400 naming each field refused."""
    if not launch_runs_script(payload):
        return {}
    if not script_allowed(user=user):
        raise ApiError(403, SCRIPT_NOT_ALLOWED)
    try:
        return script_launch_fields(owner=user, payload=payload)
    except ScriptRefused as refused:
        raise ApiError(400, "invalid experiment", refused.errors) from None


def launch_payload_bounds_check(payload: dict[str, Any]) -> dict[str, list[str]]:
    """Sizes the form cannot take safely: an integer too big for a float (lr) or a database
    column is an OverflowError there, and a huge string would be echoed back in the error."""
    errors: dict[str, list[str]] = {}
    for key in FIELD_TYPES:
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_JSON_INT:
            errors[key] = [f"out of range (at most {MAX_JSON_INT} in size)"]
        elif isinstance(value, str) and len(value) > (
            most := MAX_PATH_CHARS if key in PATH_FIELDS else MAX_STRING_CHARS
        ):
            errors[key] = [f"at most {most} characters, not {len(value)}"]
    gpus = payload.get("gpus")
    if isinstance(gpus, list):
        if len(gpus) > MAX_GPU_IDS:
            errors["gpus"] = [f"at most {MAX_GPU_IDS} GPU ids, not {len(gpus)}"]
        elif any(isinstance(g, int) and not isinstance(g, bool) and g < 0 for g in gpus):
            errors["gpus"] = ["GPU ids are whole numbers from 0"]
    return errors


def launch_form_data(payload: dict[str, Any]) -> dict[str, Any]:
    """Omitted fields take the form's defaults."""
    defaults = {name: Experiment._meta.get_field(name).get_default() for name in FIELDS}
    defaults["processes"] = None  # decided by the strategy and the GPUs
    defaults["nodes"] = None  # one machine, or as many as `machines` names
    defaults["backend"] = None  # the server's default (core/backends.py)
    return {**defaults, **payload}


def launch_limited_error(refused: LaunchLimited) -> ApiError:
    return ApiError(
        429,
        refused.message,
        details=refused.as_details(),
        headers={"Retry-After": str(refused.retry_after)},
    )
