"""Bounded unpacking of uploaded archives: apart from their readers because it is the one place
that trusts nothing about a zip or a tar. Sizes are counted as bytes really come out (headers can
lie), members are counted, paths are kept inside the scratch folder (zip slip), links and devices
are refused, a zip's members are read only where zipfile's reader is bounded (stored, deflate),
a small tar.gz cannot decompress to gigabytes, and an .xz is decoded within a memory limit.

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
import stat
import struct
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
# No reader of ours asks for more at once (members are copied COPY_CHUNK at a time): a bigger
# read is a tar header that declares a huge size (a pax or GNU long-name header, read whole).
MAX_READ = 2 * COPY_CHUNK
# A member's name: what a file system takes (a part of 255 bytes), and no deeper than a folder
# tree a person makes (a deeper one makes Path.mkdir recurse past Python's limit).
MAX_NAME_CHARS = 1024
MAX_NAME_PARTS = 64
MAX_PART_BYTES = 255
ZIP_END_SEARCH = 22 + 65535  # the end record and the longest comment it may carry
ZIP_ENTRY_HEADER = 46  # a central directory entry's fixed part, before its name and extras
# The zip methods read: those whose reader in zipfile is bounded. ZipExtFile asks the deflate
# decompressor for at most the bytes wanted (max_length); bzip2 and LZMA members it decompresses
# whole chunk by chunk with no bound, so a few KB of them expand to gigabytes in one read,
# whatever the copy around it counts. Method 9 (deflate64) and the rest zipfile cannot read.
ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
ZIP_METHODS_REFUSED = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA", 9: "deflate64"}
# What liblzma may allocate to decode an .xz: its dictionary is what the stream's header declares
# (up to 4 GiB), allocated before a byte is decoded. xz -9 needs 65 MiB to decode.
XZ_MEMLIMIT = 96 * 1024 * 1024
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
    """An archive member's path, refused where it would land outside the folder (zip slip), or
    where no file system would take it (a control character, too long, too deep)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise ImportRefused(400, f"archive member {name[:120]!r} points outside its folder")
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise ImportRefused(400, f"archive member {name[:120]!r} has a control character")
    too_long = any(len(part.encode("utf-8", "replace")) > MAX_PART_BYTES for part in path.parts)
    if len(name) > MAX_NAME_CHARS or len(path.parts) > MAX_NAME_PARTS or too_long:
        raise ImportRefused(
            400,
            f"archive member {name[:120]!r} has a name over {MAX_NAME_CHARS} characters, "
            f"{MAX_NAME_PARTS} folders deep or {MAX_PART_BYTES} bytes a part",
        )
    return path


def _os_error_text(exc: BaseException) -> str:
    """An error's words without the scratch folder's path in them."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


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


def _zip_directory_count(source: IO[bytes], most: int) -> None:
    """Refuse a zip whose central directory lists over `most` entries, counted by walking its
    headers before zipfile reads them: zipfile builds every entry first, so a 64 MiB directory
    of tiny entries would cost a million objects before the bound is met. The walk reads one
    fixed-size header at a time (never the directory whole), so it costs the same whatever the
    directory says of itself. Left to zipfile where there is no end record (its own refusal
    says so)."""
    source.seek(0, io.SEEK_END)
    size = source.tell()
    source.seek(max(0, size - ZIP_END_SEARCH))
    tail = source.read()
    end = tail.rfind(b"PK\x05\x06")
    if end < 0 or end + 22 > len(tail):
        source.seek(0)
        return
    directory_bytes = struct.unpack("<I", tail[end + 12 : end + 16])[0]
    last = end  # the record just after the directory
    if directory_bytes == 0xFFFFFFFF and tail[end - 20 : end - 16] == b"PK\x06\x07":
        # A zip64's: its own end record (56 bytes) sits before its locator (20), as zipfile
        # reads it.
        last = end - 20 - 56
        if last < 0 or tail[last : last + 4] != b"PK\x06\x06":
            source.seek(0)
            return
        directory_bytes = struct.unpack("<Q", tail[last + 40 : last + 48])[0]
    start = size - len(tail) + last - directory_bytes  # where it is, whatever it says of itself
    if start < 0:
        source.seek(0)
        return  # zipfile's refusal: a directory larger than the file
    offset = count = 0
    while offset + ZIP_ENTRY_HEADER <= directory_bytes:
        source.seek(start + offset)
        header = source.read(ZIP_ENTRY_HEADER)
        if len(header) < ZIP_ENTRY_HEADER or not header.startswith(b"PK\x01\x02"):
            break
        count += 1
        if count > most:
            raise ImportRefused(400, f"the archive holds over {most} members")
        offset += ZIP_ENTRY_HEADER + sum(struct.unpack("<HHH", header[28:34]))
    source.seek(0)


def _zip_member_kind(info: zipfile.ZipInfo) -> str:
    """file, folder, link or device, by the Unix mode where the archive keeps one."""
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        return "link"
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        return "device"
    return "folder" if info.is_dir() else "file"


def _zip_method_check(info: zipfile.ZipInfo) -> None:
    """Refuse a member compressed other than stored or deflate (see ZIP_METHODS), read or not:
    the archive is refused whole, naming the member and its method, before anything expands."""
    if info.compress_type not in ZIP_METHODS:
        method = ZIP_METHODS_REFUSED.get(info.compress_type, f"method {info.compress_type}")
        raise ImportRefused(
            400,
            f"archive member {info.filename[:120]!r} is compressed with {method}: "
            f"only stored or deflate members are read (zip them with deflate)",
        )


def zip_unpack(*, source: IO[bytes], root: Path, bounds: Bounds | None = None) -> list[Path]:
    unpacker = _Unpacker(root, bounds or import_bounds())
    try:
        _zip_directory_count(source, unpacker.bounds.members)
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                _zip_method_check(info)
                kind = _zip_member_kind(info)
                if kind == "device":
                    raise ImportRefused(400, f"archive member {info.filename[:120]!r} is a device")
                target = unpacker.member(
                    info.filename, info.file_size, is_file=kind == "file", is_link=kind == "link"
                )
                if target is not None:
                    with archive.open(info) as member:
                        unpacker.copy(member, target, info.filename)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        RuntimeError,
        EOFError,
        OSError,
        zlib.error,
    ) as exc:
        # RuntimeError: an encrypted member; OSError and EOFError: a truncated or corrupt one;
        # zlib.error: a deflate stream damaged inside (found by tests/test_fuzz_files.py).
        raise ImportRefused(400, f"not a readable zip: {_os_error_text(exc)}"[:300]) from None
    except (UnicodeDecodeError, ValueError) as exc:  # a name flagged UTF-8 that is not
        raise ImportRefused(400, f"not a readable zip: {exc}"[:300]) from None
    return unpacker.files


class _CappedStream(io.RawIOBase):
    """A decompressed stream that refuses to give more than `cap` bytes in all: tarfile reads
    and skips through it, and a small tar.gz can decompress to tens of gigabytes (skipped
    members, or a header that declares a huge size, which tarfile reads into memory)."""

    def __init__(self, inner: IO[bytes] | gzip.GzipFile | io.RawIOBase, cap: int, bounds: Bounds):
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
        if size > MAX_READ:
            raise ImportRefused(400, f"the archive has a header of over {MAX_READ} bytes")
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


class _XzStream(io.RawIOBase):
    """An .xz stream decoded within XZ_MEMLIMIT (lzma.LZMAFile takes no memory limit, and
    liblzma allocates the dictionary a header declares), at most the bytes asked for a read.
    Seeks forward by decoding its way there, back by decoding again from the start, as
    LZMAFile does."""

    def __init__(self, source: IO[bytes]):
        super().__init__()
        self.source = source
        self._rewind()

    def _rewind(self) -> None:
        self.source.seek(0)
        self.decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def read(self, size: int | None = -1) -> bytes:
        size = COPY_CHUNK if size is None or size < 0 else size
        while size and not self.decoder.eof:
            data = self.source.read(COPY_CHUNK) if self.decoder.needs_input else b""
            if self.decoder.needs_input and not data:
                raise EOFError("the .xz stream ends before its end marker")
            out = self.decoder.decompress(data, size)
            if out:
                self.position += len(out)
                return out
        return b""

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self.position + offset
        if whence not in (io.SEEK_SET, io.SEEK_CUR) or target < 0:
            raise OSError("an .xz stream seeks from its start or where it is only")
        if target < self.position:
            self._rewind()
        while self.position < target and self.read(min(COPY_CHUNK, target - self.position)):
            pass
        return self.position


def _decompressed(source: IO[bytes]) -> IO[bytes] | gzip.GzipFile | io.RawIOBase:
    head = source.read(6)
    source.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=source, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(source)  # a fixed 900 KB a block, at most the bytes asked for
    if head.startswith(b"\xfd7zXZ"):
        return _XzStream(source)
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
    except lzma.LZMAError as exc:
        if "memory" in str(exc).lower():
            raise ImportRefused(
                400, f"the .xz stream needs over {XZ_MEMLIMIT} bytes of memory to decode"
            ) from None
        raise ImportRefused(400, f"not a readable tar archive: {exc}"[:300]) from None
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        text = _os_error_text(exc)
        raise ImportRefused(400, f"not a readable tar archive: {text}"[:300]) from None
    return unpacker.files
