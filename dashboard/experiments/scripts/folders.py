"""Folders of code on the workers (a script run's ``code_path``): only under the script roots the
machine declares (``TRAINYARD_SCRIPT_ROOTS``), and the entry point a file inside the folder.

Asked twice with the same words: by the server at launch (which in our deployments shares the
workers' file system), and by the worker that starts the attempt, against its own roots (a
folder may have moved, or the machine may declare other roots). Links are followed before the
check, so that neither the folder nor the entry point reaches outside by one.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from django.conf import settings


def script_roots() -> list[Path]:
    """This machine's script roots, as declared (empty: no folder is allowed)."""
    return [Path(root) for root in settings.TRAINYARD_SCRIPT_ROOTS]


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def code_path_refusal(*, code_path: str) -> str | None:
    """Why `code_path` cannot be a script run's code here, or None where it can: it must be an
    absolute folder under one of this machine's script roots, and exist."""
    roots = script_roots()
    if not roots:
        return (
            "no folder on the workers is allowed: TRAINYARD_SCRIPT_ROOTS is empty (the "
            "administrator sets it); upload the code instead"
        )
    where = ", ".join(str(root) for root in roots)
    if not os.path.isabs(code_path) or ".." in PurePosixPath(code_path).parts:
        return f"give an absolute folder under the script roots ({where}), without '..'"
    try:
        folder = Path(code_path).resolve()
        if not any(_inside(folder, root.resolve()) for root in roots):
            return f"{code_path} is not under the script roots ({where})"
        if not folder.is_dir():
            return f"no folder {code_path}"
    except (OSError, ValueError):  # a NUL, a name too long for the file system
        return f"no folder {code_path}"
    return None


def entrypoint_refusal(*, folder: Path, entrypoint: str) -> str | None:
    """Why `entrypoint` is not a file of `folder`, or None where it is (a link is followed,
    and must not leave the folder)."""
    try:
        target = (folder / entrypoint).resolve()
        if _inside(target, folder.resolve()) and target.is_file():
            return None
    except (OSError, ValueError):  # a NUL, a name too long for the file system
        pass
    return f"{entrypoint} is not a file in {folder}"
