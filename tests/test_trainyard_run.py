"""`trainyard run`'s packing: what git would keep of a folder, and the repository's record."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from trainyard.pack import GIT_RECORD, PackError, files_kept, folder_pack


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


FOLDER = {
    "train.py": "print('hi')\n",
    "lib/model.py": "X = 1\n",
    ".gitignore": "*.pt\nruns/\n",
    "lib/.gitignore": "scratch.txt\n",
    "lib/scratch.txt": "notes\n",
    "model.pt": "weights\n",
    "runs/events.out": "tb\n",
}
KEPT = [".gitignore", "lib/.gitignore", "lib/model.py", "train.py"]


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)


def test_outside_a_repository_the_gitignore_files_decide(tmp_path: Path) -> None:
    write(tmp_path, FOLDER)
    assert files_kept(tmp_path) == KEPT


def test_in_a_repository_git_decides_and_its_commit_travels(tmp_path: Path) -> None:
    write(tmp_path, FOLDER)
    git(tmp_path, "init", "-q")
    git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "first")
    (tmp_path / "train.py").write_text("print('changed')\n")
    (tmp_path / "new.py").write_text("Y = 2\n")  # untracked, not ignored: uploaded too
    assert files_kept(tmp_path) == sorted([*KEPT, "new.py"])
    data, files = folder_pack(tmp_path, entrypoint="train.py")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        names = archive.getnames()
        record = json.loads(archive.extractfile(GIT_RECORD).read())  # type: ignore[union-attr]
    assert files == 5 and sorted(names) == sorted([*KEPT, "new.py", GIT_RECORD])
    assert len(record["commit"]) == 40 and record["dirty"] is True
    assert "+print('changed')" in record["diff"]


def test_an_entry_point_that_would_not_be_uploaded_is_refused(tmp_path: Path) -> None:
    write(tmp_path, FOLDER)
    with pytest.raises(PackError, match="model.pt is not among the files"):
        folder_pack(tmp_path, entrypoint="model.pt")
