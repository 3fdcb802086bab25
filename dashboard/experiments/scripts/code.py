"""Uploaded code: a user's folder as a .tar.gz or .zip, checked, then kept once by its content's
hash (``code_dir()/<sha256>.<kind>``) with a row per owner (``CodeArchive``).

Checked by unpacking it, bounded, into a scratch folder (core/archives.py: bytes counted as they
come out, members counted, every path inside the folder, no links, no devices), so that what is
kept is what a worker will unpack: a refusal names the member and the bound, and nothing is kept.
A launch lists its files through the same checks without writing them (``code_files``); the
worker unpacks it afresh for each attempt of a run (``code_unpack_for_run``); the run's owner may
download it as kept (``code_archive_open``, ``code_download_name``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, transaction

from dashboard.env import env_int
from dashboard.experiments.core.archives import (
    MAX_MEMBERS,
    Bounds,
    ImportRefused,
    tar_unpack,
    zip_unpack,
)
from dashboard.experiments.models import CodeArchive, Experiment

# An archive's kind by its first bytes (its name is the client's word): gzip, then a zip's local
# header or the end record of an empty one.
MAGIC = ((b"\x1f\x8b", "tar.gz"), (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"))
HASH_CHUNK = 1024 * 1024


class CodeRefused(Exception):
    """The upload is not code Trainyard can keep, with the reason: a 400, or a 413 where it is
    over a size bound (its bytes, or what it unpacks to), as an import's refusals are."""

    def __init__(self, message: str, *, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Unpacked:
    files: int
    unpacked_bytes: int


def code_max_bytes() -> int:
    """The largest archive taken, as uploaded."""
    return env_int("TRAINYARD_CODE_MAX_BYTES", 64 * 1024 * 1024)


def code_bounds() -> Bounds:
    """What an archive may hold: every file is unpacked; over the bytes bound a 413 (the
    import's answer), over another a 400."""
    return Bounds(
        unpacked_bytes=env_int("TRAINYARD_CODE_MAX_UNPACKED_BYTES", 256 * 1024 * 1024),
        members=env_int("TRAINYARD_CODE_MAX_FILES", MAX_MEMBERS),
        keep=lambda path: True,
    )


def code_dir() -> Path:
    return Path(settings.TRAINYARD_CODE_DIR)


def code_path(*, code: CodeArchive) -> Path:
    return code_dir() / f"{code.sha256}.{code.kind}"


def code_kind(*, upload: IO[bytes]) -> str:
    head = upload.read(4)
    upload.seek(0)
    for magic, kind in MAGIC:
        if head.startswith(magic):
            return kind
    raise CodeRefused("the archive is neither a .tar.gz nor a .zip")


def code_sha256(*, upload: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := upload.read(HASH_CHUNK):
        digest.update(chunk)
    upload.seek(0)
    return digest.hexdigest()


def code_unpack(*, upload: IO[bytes], kind: str, root: Path) -> Unpacked:
    """Unpack every file of the archive under `root`, within code_bounds(); CodeRefused names
    what is wrong (a path outside the folder, a link, a device, a bound passed, unreadable)."""
    unpack = tar_unpack if kind == "tar.gz" else zip_unpack
    try:
        files = unpack(source=upload, root=root, bounds=code_bounds())
    except ImportRefused as refused:
        raise CodeRefused(refused.message, status=refused.status) from None
    finally:
        upload.seek(0)
    kept = set(files)  # a member named twice is one file, the last one's bytes
    return Unpacked(files=len(kept), unpacked_bytes=sum(path.stat().st_size for path in kept))


def _keep(*, upload: IO[bytes], target: Path, size: int) -> None:
    """Write the archive to `target` whole or not at all: a temporary name, written and synced,
    then a rename (synced too), readable by the workers' user. A file already there of the size
    is these bytes (their hash names it); one of another size was cut short, and is replaced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.stat().st_size == size:
        return
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
    try:
        os.fchmod(handle, 0o644)
        with os.fdopen(handle, "wb") as out:
            while chunk := upload.read(HASH_CHUNK):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    finally:
        upload.seek(0)


def code_store(*, owner: Any, upload: IO[bytes], size: int) -> CodeArchive:
    """Check the archive and keep it; the same content again from the same owner is the same
    row. CodeRefused where it is not code Trainyard can keep."""
    if size > code_max_bytes():
        raise CodeRefused(
            f"the archive is {size} bytes, over the {code_max_bytes()} taken", status=413
        )
    kind = code_kind(upload=upload)
    sha256 = code_sha256(upload=upload)
    with tempfile.TemporaryDirectory(prefix="trainyard-code-") as scratch:
        unpacked = code_unpack(upload=upload, kind=kind, root=Path(scratch))
    if unpacked.files == 0:
        raise CodeRefused("the archive holds no files")
    # Kept first, even for a row that exists: its file may have been lost since.
    _keep(upload=upload, target=code_dir() / f"{sha256}.{kind}", size=size)
    existing = CodeArchive.objects.filter(owner=owner, sha256=sha256).first()
    if existing is not None:
        return existing
    fields = {"kind": kind, "bytes": size, **asdict(unpacked)}
    try:
        with transaction.atomic():
            return CodeArchive.objects.create(owner=owner, sha256=sha256, **fields)
    except IntegrityError:  # the same upload, stored by a request that got there first
        return CodeArchive.objects.get(owner=owner, sha256=sha256)


def code_archive_open(*, code: CodeArchive) -> IO[bytes]:
    """The kept archive, opened (to unpack, list or download it); CodeRefused where this machine
    does not have it."""
    path = code_path(code=code)
    try:
        return path.open("rb")
    except OSError:
        raise CodeRefused(
            f"the code {code.sha256[:12]} is not at {path} on this machine "
            "(TRAINYARD_CODE_DIR must be shared by the server and the workers): upload it again"
        ) from None


def code_download_name(*, experiment: Experiment, code: CodeArchive) -> str:
    """What a run's upload downloads as: the run, the hash's head (the same name for the same
    bytes) and its kind as uploaded ("run-12-code-3f2a9c1b7d4e.tar.gz")."""
    return f"run-{experiment.pk}-code-{code.sha256[:12]}.{code.kind}"


def code_files(*, code: CodeArchive) -> frozenset[str]:
    """The paths of the files the kept archive holds ("train.py", "lib/model.py"), read through
    the upload's checks and bounds but written nowhere: each file is named to `keep`, which
    writes none (a zip's are never read; a tar's are read past, as its unpack would)."""
    names: set[str] = set()

    def listed(path: PurePosixPath) -> bool:
        names.add(str(path))
        return False

    unpack = tar_unpack if code.kind == "tar.gz" else zip_unpack
    with code_archive_open(code=code) as archive:
        try:
            # The root is never written to: `listed` keeps no file.
            unpack(source=archive, root=code_dir(), bounds=replace(code_bounds(), keep=listed))
        except ImportRefused as refused:
            raise CodeRefused(refused.message, status=refused.status) from None
    return frozenset(names)


def code_unpack_for_run(*, experiment: Experiment) -> Path:
    """The run's uploaded code, unpacked afresh for its attempt under the run's folder
    (TRAINYARD_RUNS_DIR/<id>/code/attempt-<n>), with the upload's unpacker and bounds: a
    script may write beside itself, and an attempt must not start from what the last one left.
    Unpacked into a scratch name, then renamed whole: on a runs folder the machines of one run
    share, the first machine's unpack is the others' (the same archive, by its hash)."""
    code = experiment.code
    if code is None:
        raise CodeRefused(f"run {experiment.pk} has no uploaded code")
    parent = Path(settings.TRAINYARD_RUNS_DIR) / str(experiment.pk) / "code"
    folder = parent / f"attempt-{experiment.attempt}"
    parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=parent, prefix=f".{folder.name}-"))
    try:
        with code_archive_open(code=code) as archive:
            code_unpack(upload=archive, kind=code.kind, root=scratch)
        os.rename(scratch, folder)
    except OSError:
        if not folder.is_dir():  # not another machine's unpack of this attempt: a real error
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder
