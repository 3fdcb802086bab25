"""A script run from the launch page: the fields the page adds to the launch form when the user
picks "Your script" (only users allowed to run scripts are offered it).

The code is uploaded before the launch (the page packs a chosen folder, or sends a chosen
archive, to POST /api/code/ and keeps the answered id in the hidden `code` field), so a refused
launch shows the page again without uploading twice. The arguments are one line, split as a
shell splits them, since that is how people write them. Everything else is judged by
scripts/launch.py, as for the API, each refusal said on the field where the fix is.
"""

from __future__ import annotations

import shlex
from typing import Any

from django import forms

from dashboard.experiments.scripts.folders import script_roots
from dashboard.experiments.scripts.launch import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    ScriptRefused,
    script_launch_fields,
)

# The folders offered for `code_path` (those directly under the script roots), bounded: the page
# lists them, and a root may hold thousands.
MAX_FOLDERS_OFFERED = 200
# The longest line the arguments may take: every argument at its longest, with a space each.
ARGS_LINE_CHARS = MAX_ARGS * (MAX_ARG_CHARS + 3)
# Launch-JSON fields by the page's field that shows their refusal.
FIELD_OF = {"code": "code", "code_path": "code_path", "entrypoint": "entrypoint", "args": "args"}


def script_folders() -> list[str]:
    """The folders directly under this machine's script roots (a run may name any folder under
    them; these are the ones a person picks from), sorted, at most MAX_FOLDERS_OFFERED."""
    found: list[str] = []
    for root in script_roots():
        try:
            children = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:  # a root declared but not there: nothing to offer from it
            continue
        found.extend(str(path) for path in children if not path.name.startswith("."))
    return found[:MAX_FOLDERS_OFFERED]


def _path_field(*, label: str, help_text: str, suggestions: str, placeholder: str) -> forms.Field:
    """A path typed in, with the page's suggestions (a <datalist> of that id) to pick from."""
    attrs = {"list": suggestions, "placeholder": placeholder}
    return forms.CharField(
        required=False,
        max_length=1000,  # the launch JSON's bound on a path
        label=label,
        help_text=help_text,
        widget=forms.TextInput(attrs=attrs),
    )


class ScriptForm(forms.Form):
    """The page's script fields; `launch_fields` turns them into the launch's, or says why not."""

    code = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)
    code_path = _path_field(
        label="Or a folder on the workers",
        help_text="A folder under the workers' script roots, used in place (nothing uploaded).",
        suggestions="script-folders",
        placeholder="/srv/code/app",
    )
    entrypoint = _path_field(
        label="Entry point",
        help_text="The script torchrun starts, relative to the code's folder (e.g. train.py).",
        suggestions="script-entrypoints",
        placeholder="train.py",
    )
    args = forms.CharField(
        required=False,
        max_length=ARGS_LINE_CHARS,
        label="Arguments",
        help_text="As on a command line, passed after the entry point: --epochs 2 --lr 0.01",
        widget=forms.TextInput(attrs={"placeholder": "--epochs 2"}),
    )

    def clean_args(self) -> list[str]:
        line = self.cleaned_data.get("args") or ""
        try:
            return shlex.split(line)
        except ValueError as exc:  # "No closing quotation"
            raise forms.ValidationError(f"cannot split it as a shell would: {exc}") from None

    def launch_fields(self, *, owner: Any, name: str) -> dict[str, Any] | None:
        """The script fields to launch with (scripts/launch.py's: the run is named after its
        entry point where `name` is empty), or None with each refusal added on its field. Call
        after is_valid()."""
        data = self.cleaned_data
        payload = {
            "name": name.strip(),
            "entrypoint": data.get("entrypoint") or "",
            "args": data.get("args") or [],
            "code": data.get("code"),
            "code_path": (data.get("code_path") or "").strip(),
        }
        try:
            return script_launch_fields(owner=owner, payload=payload)
        except ScriptRefused as refused:
            for key, messages in refused.errors.items():
                for message in messages:
                    self.add_error(FIELD_OF.get(key), message)
            return None

    @staticmethod
    def initial_of(fields: dict[str, Any]) -> dict[str, Any]:
        """The page's initial values from a run's launch fields (a copy of a script run)."""
        code = fields.get("code")  # the run's CodeArchive, or its id
        return {
            "code": getattr(code, "pk", code),
            "code_path": fields.get("code_path") or "",
            "entrypoint": fields.get("entrypoint") or "",
            "args": shlex.join(fields.get("args") or []),
        }
