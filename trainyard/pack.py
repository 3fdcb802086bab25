"""A folder packed for `POST /api/code/`, as `trainyard run` uploads it: the files git would
keep (inside a repository, `git ls-files` with the standard excludes; elsewhere, the folder's
.gitignore files read with pathspec, git's own rules), never `.git`, as a .tar.gz whose
members are plain files with the folder's relative names. Where the folder is in a repository,
`.trainyard/git.json` records its commit and the diff of what changed since, which the run's
record keeps (an unpacked upload has no `.git` of its own).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pathspec

# The engine reads the record it writes: one home for how a repository is read.
from training.scripts.provenance import GIT_RECORD, git_output, git_state


class PackError(Exception):
    """The folder cannot be packed (nothing in it, an entry point not in it)."""


def files_kept(folder: Path) -> list[str]:
    """The folder's files that git would keep, relative, sorted."""
    flags = ("-z", "--cached", "--others", "--exclude-standard")
    listed = git_output(folder, "ls-files", *flags, "--", ".")
    names = _files_walked(folder) if listed is None else [n for n in listed.split("\0") if n]
    # Tracked files deleted since, and links (the server refuses them): left out.
    return sorted(n for n in set(names) if (folder / n).is_file() and not (folder / n).is_symlink())


def _files_walked(folder: Path) -> list[str]:
    """Without git: every file but .git's and what the .gitignore files (at any depth) exclude."""
    kept: list[str] = []
    specs: list[tuple[str, pathspec.PathSpec]] = []
    for root, dirs, files in os.walk(folder):
        here = Path(root).relative_to(folder).as_posix()
        prefix = "" if here == "." else here + "/"
        if ".gitignore" in files:
            lines = (Path(root) / ".gitignore").read_text(errors="replace").splitlines()
            specs.append((prefix, pathspec.GitIgnoreSpec.from_lines(lines)))

        dirs[:] = sorted(d for d in dirs if d != ".git" and not _ignored(specs, prefix + d + "/"))
        kept += [prefix + f for f in files if not _ignored(specs, prefix + f)]
    return kept


def _ignored(specs: list[tuple[str, pathspec.PathSpec]], path: str) -> bool:
    """Whether a .gitignore above `path` (a folder's ends with /) excludes it."""
    return any(path.startswith(p) and spec.match_file(path[len(p) :]) for p, spec in specs)


def git_record(folder: Path) -> bytes | None:
    """The repository's commit and diff as the run's record keeps them (the engine's reading)."""
    state = git_state(folder)
    return None if state is None else json.dumps(state).encode()


def folder_pack(folder: Path, *, entrypoint: str) -> tuple[bytes, int]:
    """The folder as a .tar.gz, and how many files it holds."""
    names = files_kept(folder)
    if not names:
        raise PackError(f"nothing to upload in {folder} (every file is ignored?)")
    if Path(entrypoint).as_posix() not in names:
        raise PackError(f"{entrypoint} is not among the files of {folder} that would be uploaded "
                        "(outside the folder, or ignored by .gitignore)")  # fmt: skip
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name in names:
            archive.add(folder / name, arcname=name, recursive=False)
        record = git_record(folder)
        if record is not None and GIT_RECORD not in names:
            info = tarfile.TarInfo(GIT_RECORD)
            info.size = len(record)
            archive.addfile(info, io.BytesIO(record))
    return out.getvalue(), len(names)
