"""A script study's axes over the script's own arguments (issue 32): ``"args.lr": [0.1, 0.01]``
gives each cell the base's ``args`` with ``--lr 0.1`` (resp. ``--lr 0.01``) appended, several
such axes in the axes' order. A script reads its settings from its command line, not from the
engine's fields, so these are its axes as lr and batch_size are the engine's.

A value is a number or a string, passed as str(value): true/false and null have no one spelling
on a command line (``--flag``? ``--flag true``?), so they are refused rather than guessed. A
cell's whole args are then checked as one launch's are (scripts/launch.py's bounds), by grid.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dashboard.experiments.web.api_launch import DEFAULT_STRATEGY, launch_runs_script

ARGS_AXIS = "args."
# A flag's name, as `--<name>` gives it to argparse: never a second leading dash.
FLAG_NAME = r"[A-Za-z0-9_][A-Za-z0-9_-]*"
ARGS_AXIS_PATTERN = f"^{re.escape(ARGS_AXIS)}{FLAG_NAME}$"  # what the docs say an axis may be


def is_args_axis(key: str) -> bool:
    return key.startswith(ARGS_AXIS)


def _flag(key: str) -> str:
    return f"--{key.removeprefix(ARGS_AXIS)}"


def args_axis_error(*, key: str, values: list[Any], base: dict[str, Any]) -> str | None:
    """Why `key` with `values` is no axis of this base's script (None: it is one)."""
    if not re.fullmatch(FLAG_NAME, key.removeprefix(ARGS_AXIS)):
        return (
            f"{key!r} names no flag: after 'args.', letters, digits, - and _, not starting "
            "with - (args.lr appends --lr <value>)"
        )
    if any(isinstance(v, bool) or not isinstance(v, int | float | str) for v in values):
        return f"each value is a number or a string, appended as {_flag(key)} <value>"
    if not launch_runs_script(base):
        strategy = base.get("strategy", DEFAULT_STRATEGY)
        return f"only a script run reads arguments: the base's strategy is {strategy}, not script"
    return None


def cell_payload(*, base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A cell's launch body: the base with the cell's values, each args axis's pair appended to
    the base's args in the axes' order. Base args that are no list are left for the launch
    checks to refuse."""
    fields = {key: value for key, value in values.items() if not is_args_axis(key)}
    appended = [
        word
        for key, value in values.items()
        if is_args_axis(key)
        for word in (_flag(key), str(value))
    ]
    payload = {**base, **fields}
    args = base.get("args") or []
    if appended and isinstance(args, list):
        payload["args"] = [*args, *appended]
    return payload


def args_axes_read(*, args: list[str], axes: Iterable[str]) -> dict[str, str]:
    """Each args axis's value in a cell's stored args, as the script got it: the word after the
    last `--<flag>` (the cell's pair is appended after the base's args: cell_payload). Read by
    name, not by place: a study's axes come back from PostgreSQL's jsonb in another order."""
    found: dict[str, str] = {}
    for key in axes:
        if not is_args_axis(key):
            continue
        flag = _flag(key)
        at = max((i for i, word in enumerate(args[:-1]) if word == flag), default=None)
        if at is not None:
            found[key] = args[at + 1]
    return found
