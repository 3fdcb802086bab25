"""Bounded unpacking of uploaded archives: apart from their readers because it is the one place
that trusts nothing about a zip or a tar. Sizes are counted as bytes really come out (headers can
lie), members are counted, paths are kept inside the scratch folder (zip slip), links and devices
are refused, and a small tar.gz cannot decompress to gigabytes.

Two callers, each with its `Bounds`: an import (metrics/imports.py) unpacks only the TensorBoard
event files of a log folder, and refuses one too big with a 413; uploaded code (scripts/code.py)
unpacks every file, and refuses anything over its bounds with a 400. The refusal
(ImportRefused, the import's name for it) lives here, below the readers, which raise it too.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from dashboard.env import env_int

MAX_MEMBERS = 10_000
COPY_CHUNK = 1024 * 1024
# Tar headers, their padding and long names, beyond the members' own bytes: what the
# decompressed stream of a tar may hold past the unpacked limit.
TAR_OVERHEAD_PER_MEMBER = 4096


class ImportRefused(Exception):
    """The file cannot be imported: 400 (unreadable) or 413 (too big), with the reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def import_max_unpacked_bytes() -> int:
    return env_int("TRAINYARD_IMPORT_MAX_UNPACKED_BYTES", 200 * 1024 * 1024)


def _is_event_file(path: PurePosixPath) -> bool:
    return "tfevents" in path.name


@dataclass(frozen=True)
class Bounds:
    """What one caller unpacks, and how much of it."""

    unpacked_bytes: int  # the members' bytes in all, as they come out
    members: int = MAX_MEMBERS  # files, folders and the rest
    keep: Callable[[PurePosixPath], bool] = _is_event_file  # the files unpacked; others skipped
    over_status: int = 413  # the answer to an archive over unpacked_bytes


def import_bounds() -> Bounds:
    return Bounds(unpacked_bytes=import_max_unpacked_bytes())


def _member_path(name: str) -> PurePosixPath:
    """An archive member's path, refused where it would land outside the folder (zip slip)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise ImportRefused(400, f"archive member {name[:120]!r} points outside its folder")
    return path


def _copy_capped(source: IO[bytes], target: Path, budget: int, name: str, bounds: Bounds) -> int:
    """Copy at most `budget` bytes, counting what really comes out (headers can lie)."""
    copied = 0
    with target.open("wb") as out:
        while chunk := source.read(COPY_CHUNK):
            copied += len(chunk)
            if copied > budget:
                raise ImportRefused(
                    bounds.over_status,
                    f"the archive unpacks to over {bounds.unpacked_bytes} bytes "
                    f"(at member {name[:120]!r})",
                )
            out.write(chunk)
    return copied


@dataclass
class _Unpacker:
    """Checks every member of an archive and unpacks those its bounds keep under `root`."""

    root: Path
    bounds: Bounds
    # A tar's skipped member is decompressed all the same (to reach the next header), so it
    # costs its bytes; a zip's is never read.
    skipped_cost: bool = False
    left: int = 0
    members: int = 0
    files: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.left = self.bounds.unpacked_bytes

    def member(self, name: str, size: int, *, is_file: bool, is_link: bool) -> Path | None:
        """Where to unpack the member, or None to skip it."""
        self.members += 1
        if self.members > self.bounds.members:
            raise ImportRefused(400, f"the archive holds over {self.bounds.members} members")
        path = _member_path(name)
        if is_link:
            raise ImportRefused(400, f"archive member {name[:120]!r} is a link")
        if size > self.left:
            raise ImportRefused(
                self.bounds.over_status,
                f"archive member {name[:120]!r} unpacks to {size} bytes, over the "
                f"{self.bounds.unpacked_bytes} bytes the archive may unpack to",
            )
        if not is_file or not self.bounds.keep(path):
            self.left -= size if self.skipped_cost else 0
            return None
        target = self.root.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def copy(self, source: IO[bytes], target: Path, name: str) -> None:
        self.left -= _copy_capped(source, target, self.left, name, self.bounds)
        self.files.append(target)


def zip_unpack(*, source: IO[bytes], root: Path, bounds: Bounds | None = None) -> list[Path]:
    unpacker = _Unpacker(root, bounds or import_bounds())
    try:
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
                target = unpacker.member(
                    info.filename, info.file_size, is_file=not info.is_dir(), is_link=is_link
                )
                if target is not None:
                    with archive.open(info) as member:
                        unpacker.copy(member, target, info.filename)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, EOFError, OSError) as exc:
        # RuntimeError: an encrypted member; OSError and EOFError: a truncated or corrupt one.
        raise ImportRefused(400, f"not a readable zip: {exc}"[:300]) from None
    return unpacker.files


class _CappedStream(io.RawIOBase):
    """A decompressed stream that refuses to give more than `cap` bytes in all: tarfile reads
    and skips through it, and a small tar.gz can decompress to tens of gigabytes (skipped
    members, or a header that declares a huge size, which tarfile reads into memory)."""

    def __init__(self, inner: IO[bytes] | gzip.GzipFile, cap: int, bounds: Bounds):
        super().__init__()
        self.inner, self.cap, self.given, self.bounds = inner, cap, 0, bounds

    def _spend(self, size: int) -> None:
        self.given += size
        if self.given > self.cap:
            raise ImportRefused(
                self.bounds.over_status,
                f"the archive unpacks to over {self.bounds.unpacked_bytes} bytes",
            )

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.inner.tell()

    def read(self, size: int | None = -1) -> bytes:
        # Spent before reading: a read of gigabytes is refused before it is made.
        if size is None or size < 0:
            size = self.cap + 1  # all of it: refused, as it would be past the cap
        self._spend(size)
        return self.inner.read(size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise OSError("a capped stream seeks from its start or where it is only")
        here = self.inner.tell()
        target = offset if whence == io.SEEK_SET else here + offset
        # The decompressor reads its way there: forward from here, back from the start.
        self._spend(target - here if target >= here else target)
        return self.inner.seek(target)


def _decompressed(source: IO[bytes]) -> IO[bytes] | gzip.GzipFile:
    head = source.read(6)
    source.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=source, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(source)
    if head.startswith(b"\xfd7zXZ"):
        return lzma.LZMAFile(source)
    return source


def tar_unpack(*, source: IO[bytes], root: Path, bounds: Bounds | None = None) -> list[Path]:
    bounds = bounds or import_bounds()
    unpacker = _Unpacker(root, bounds, skipped_cost=True)
    cap = bounds.unpacked_bytes + bounds.members * TAR_OVERHEAD_PER_MEMBER
    try:
        stream = _CappedStream(_decompressed(source), cap, bounds)
        with tarfile.open(fileobj=stream, mode="r:") as archive:
            for info in archive:
                is_link = info.issym() or info.islnk()
                if not (info.isfile() or info.isdir() or is_link):
                    raise ImportRefused(400, f"archive member {info.name[:120]!r} is a device")
                target = unpacker.member(
                    info.name, info.size, is_file=info.isfile(), is_link=is_link
                )
                member = archive.extractfile(info) if target is not None else None
                if target is not None and member is not None:
                    unpacker.copy(member, target, info.name)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise ImportRefused(400, f"not a readable tar archive: {exc}"[:300]) from None
    return unpacker.files
