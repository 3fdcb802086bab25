"""What a script run ran with, for its record: the interpreter's packages (as `pip freeze`
would list them, read from the installed distributions' metadata: no pip process), and where the
code folder is a git repository, its commit and the diff of what was changed since.
"""

from __future__ import annotations

import json
import subprocess
from importlib import metadata
from pathlib import Path

from training.protocol import GitState

# What `trainyard run` packs into an upload from a repository (trainyard/pack.py).
GIT_RECORD = ".trainyard/git.json"
MAX_DIFF_CHARS = 16 * 1024  # a diff longer than this is cut, and says so
GIT_SECONDS = 10


def packages_installed() -> list[str]:
    """`name==version` of every distribution this interpreter finds, sorted by name."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(name.lower(), f"{name}=={dist.version}")
    return [found[key] for key in sorted(found)]


def git_output(folder: Path, *args: str) -> str | None:
    """What `git -C folder ARGS` prints, or None where it fails (no git, not a repository)."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed git commands in the run's own folder
            ["git", "-C", str(folder), *args], capture_output=True, text=True,
            timeout=GIT_SECONDS, check=False, errors="replace",
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(folder: Path) -> GitState | None:
    """{"commit", "dirty", "diff"} where `folder` is in a git repository, or where its upload
    recorded the repository it was packed from (`trainyard run` writes GIT_RECORD with this
    function); else None."""
    commit = git_output(folder, "rev-parse", "HEAD")
    if commit is None:
        return _git_recorded(folder / GIT_RECORD)
    diff = git_output(folder, "diff", "HEAD", "--", ".") or ""  # the folder's own changes
    if len(diff) > MAX_DIFF_CHARS:
        diff = diff[:MAX_DIFF_CHARS] + f"\n... (cut at {MAX_DIFF_CHARS} characters)\n"
    return {"commit": commit.strip(), "dirty": bool(diff), "diff": diff}


def _git_recorded(path: Path) -> GitState | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("commit"), str):
        return None
    diff = str(found.get("diff") or "")[:MAX_DIFF_CHARS]
    return {"commit": found["commit"][:64], "dirty": bool(diff), "diff": diff}
