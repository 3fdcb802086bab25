"""A script run's own launch fields (POST /api/experiments/ with "strategy": "script"): the entry
point, the script's arguments, and its code, either an upload of the requester's (``code``) or a
folder on the workers under their script roots (``code_path``), exactly one.

Checked before anything is stored, each refusal on its field: the entry point must be a file of
the code (looked up in the upload's list of files, or on disk under the folder), so that a typo
is a 400 now rather than a failed attempt on a worker later. The other fields (processes, nodes,
GPUs, machines) are the launch form's, as for DDP; who may launch one is core/access.py's.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from dashboard.experiments.core.forms import SCRIPT_FIELDS
from dashboard.experiments.models import CodeArchive
from dashboard.experiments.scripts.code import CodeRefused, code_files
from dashboard.experiments.scripts.folders import code_path_refusal, entrypoint_refusal

# A launch's whole body is at most 64 KiB (dashboard/api.py's MAX_BODY_BYTES): every args the
# schema calls valid must fit in it (128 x 400 characters, with the JSON's quotes, is ~52 KB), or
# a request the docs allow would be refused as too large.
MAX_ARGS = 128
MAX_ARG_CHARS = 400
FILES_NAMED = 5  # of the code's files, in a refusal that says what it holds
NAME_CHARS = 200  # Experiment.name's column


class ScriptRefused(Exception):
    """The script run cannot be launched: a 400, its reasons by field."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("; ".join(f"{key}: {' '.join(why)}" for key, why in errors.items()))
        self.errors = errors


def script_fields_given(*, payload: dict[str, Any]) -> list[str]:
    """The script fields a launch body sets (null, "" and [] set nothing): a run of another
    strategy is refused them, as an option its strategy does not read is."""
    return [name for name in SCRIPT_FIELDS if payload.get(name) not in (None, "", [])]


def entrypoint_error(value: Any) -> str | None:
    """Why `value` is no entry point: a relative path of a file, inside the code's folder."""
    if not isinstance(value, str) or not value.strip():
        return "give the script's file, relative to its code folder (e.g. train.py)"
    path = PurePosixPath(value)
    if "\0" in value or path.is_absolute() or ".." in path.parts or not path.parts:
        return "a path relative to the code folder, without '..' (e.g. train.py or src/train.py)"
    return None


def args_error(value: Any) -> str | None:
    """Why `value` is no list of the script's arguments."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return 'a list of strings, as a shell splits them: ["--epochs", "2"]'
    if len(value) > MAX_ARGS:
        return f"at most {MAX_ARGS} arguments, not {len(value)}"
    if any(len(item) > MAX_ARG_CHARS for item in value):
        return f"an argument has at most {MAX_ARG_CHARS} characters"
    if any("\0" in item for item in value):
        return "an argument cannot hold a NUL character"
    return None


def _upload_errors(*, owner: Any, code: Any, entrypoint: str) -> dict[str, list[str]]:
    """An upload of the requester's (another user's is no such code) holding the entry point."""
    archive = CodeArchive.objects.filter(pk=code, owner_id=owner.pk).first()
    if archive is None:
        return {"code": [f"no such code {code}: upload the folder with POST /api/code/"]}
    try:
        files = code_files(code=archive)
    except CodeRefused as refused:
        return {"code": [str(refused)]}
    if entrypoint not in files:
        more = ", ..." if len(files) > FILES_NAMED else ""
        holds = ", ".join(sorted(files)[:FILES_NAMED]) + more
        return {"entrypoint": [f"{entrypoint} is not a file in code {code} (it holds {holds})"]}
    return {}


def _folder_errors(*, code_path: str, entrypoint: str) -> dict[str, list[str]]:
    """A folder under the script roots, holding the entry point."""
    refused = code_path_refusal(code_path=code_path)
    if refused:
        return {"code_path": [refused]}
    refused = entrypoint_refusal(folder=Path(code_path), entrypoint=entrypoint)
    return {"entrypoint": [refused]} if refused else {}


def _fields_errors(payload: dict[str, Any]) -> dict[str, list[str]]:
    """The fields' own shapes, each said on its field."""
    errors: dict[str, list[str]] = {}
    if why := entrypoint_error(payload.get("entrypoint")):
        errors["entrypoint"] = [why]
    if why := args_error(payload.get("args", [])):
        errors["args"] = [why]
    given = [name for name in ("code", "code_path") if payload.get(name) not in (None, "")]
    if len(given) != 1:
        which = "both" if given else "neither"
        errors["code"] = [
            f"give exactly one of code (an id from POST /api/code/) or code_path (a folder on "
            f"the workers), not {which}"
        ]
    return errors


def script_launch_fields(*, owner: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The script fields to store with the run (its name too where none was given), once
    every check passes; ScriptRefused with the reasons by field otherwise."""
    errors = _fields_errors(payload)
    if errors:
        raise ScriptRefused(errors)
    entrypoint = str(PurePosixPath(payload["entrypoint"]))  # "./train.py" is train.py
    code, code_path = payload.get("code"), payload.get("code_path") or ""
    if code is not None:
        errors = _upload_errors(owner=owner, code=code, entrypoint=entrypoint)
    else:
        errors = _folder_errors(code_path=code_path, entrypoint=entrypoint)
    if errors:
        raise ScriptRefused(errors)
    fields: dict[str, Any] = {
        "entrypoint": entrypoint,
        "args": list(payload.get("args") or []),
        "code_id": code,
        "code_path": code_path,
    }
    if not payload.get("name"):
        fields["name"] = entrypoint[:NAME_CHARS]
    return fields
