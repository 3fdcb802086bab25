"""One copy of the dataset in shared memory for every process of a run on this machine.

The owner (local rank 0 under torchrun, the parent for Hogwild) creates a file in /dev/shm sized
for the tensors it is given (by shape and dtype: for a dataset, train/test images as uint8 and
labels as int64), maps it, and has a fill function write them in place (IDX files read straight
into the mapping, or images decoded into it; ``training.data.sources`` plans which).
The other processes on the machine map the same file with
``torch.UntypedStorage.from_file(path, shared=True)``; once every process has mapped it, the owner
unlinks it. The memory lives on until the last process unmaps it, and nothing is left in /dev/shm.

Why a named file and not torch.multiprocessing's handles: torchrun's ranks are not children of
one Python parent, so the default ``file_descriptor`` strategy cannot pass them descriptors (the
resource sharer authenticates with a per-process-tree key), and the ``file_system`` strategy
keeps its files until a ``torch_shm_manager`` daemon, a process of its own, sees every user
gone. A file we name and unlink ourselves needs no extra process, is mapped by path, and its
lifetime is explicit:

- it exists only between creation and the moment every process has mapped it (seconds, longer
  while an image folder decodes into it);
- SIGTERM in that window raises SystemExit in the owner (see ``training.cli``), whose
  ``finally`` unlinks it;
- after a SIGKILL in that window the file is named after the owning process
  (``trainyard-data-<pid>-...``) and the next run on the machine removes it once that pid is
  gone (``stale_segments_remove``).

The file is allocated with posix_fallocate before it is mapped: a full /dev/shm then fails
cleanly with ENOSPC (the run falls back to one private copy per process, and says so) instead of
a SIGBUS on the first write to a page tmpfs cannot supply.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch

from training.data.datasets import Dataset, Split, text_dataset
from training.data.sources import (
    DataInfo,
    DataPlan,
    data_plan,
    mode_choose,
    resident_dataset,
    resident_info,
    streaming_dataset,
    tensors_empty,
    workers_usable,
)
from training.data.text import TOKENS, TextData, TextSplit, text_read, text_tensor
from training.process.runtime import Runtime, all_gather
from training.protocol import SharedTensor

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PREFIX = "trainyard-data-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
_ALIGN = 64  # bytes; every tensor starts on a cache line, int64 labels stay aligned
Shapes = Mapping[str, tuple[tuple[int, ...], torch.dtype]]  # tensor name -> (shape, dtype)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "uint8" or "int64"
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the file

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * _dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Segment:
    """What the owner tells the other processes: picklable, no tensors, no descriptors."""

    path: str
    nbytes: int
    tensors: tuple[TensorSpec, ...]
    info: DataInfo | None = None  # a dataset's facts (mean, std, notes), set once it is filled


def segment_path(owner_pid: int, tag: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)[:80]
    return SHM_DIR / f"{PREFIX}{owner_pid}-{safe}"


def segment_create(
    path: Path, shapes: Shapes, fill: Callable[[dict[str, torch.Tensor]], None]
) -> tuple[dict[str, torch.Tensor], Segment]:
    """A new shared file at ``path`` holding tensors of ``shapes``, which ``fill`` writes in
    place; the caller unlinks it. OSError where /dev/shm cannot hold them (nothing is mapped
    then: the caller loads a private copy)."""
    specs: list[TensorSpec] = []
    offset = 0
    for tensor_name, (shape, dtype) in shapes.items():
        specs.append(TensorSpec(tensor_name, str(dtype).removeprefix("torch."), shape, offset))
        offset += -(-specs[-1].nbytes // _ALIGN) * _ALIGN
    segment = Segment(str(path), max(offset, _ALIGN), tuple(specs))
    free = shutil.disk_usage(SHM_DIR).free
    if free < segment.nbytes:
        raise OSError(f"{SHM_DIR} has {free:,} bytes free, the dataset needs {segment.nbytes:,}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, segment.nbytes)
    finally:
        os.close(fd)
    tensors = _map(segment)
    fill(tensors)
    return tensors, segment


def dataset_segment_create(
    plan: DataPlan, note: str, path: Path, workers: int = 0
) -> tuple[Dataset, Segment]:
    """The planned dataset, filled into a new shared file at ``path``; the caller unlinks it."""
    usable = workers_usable(workers)[0]
    tensors, segment = segment_create(path, plan.shapes, lambda t: plan.fill(t, usable))
    info = resident_info(plan, tensors, note)
    return resident_dataset(info, tensors), replace(segment, info=info)


def resident_private(plan: DataPlan, note: str, workers: int = 0) -> Dataset:
    """The planned dataset in this process's own memory."""
    tensors = tensors_empty(plan)
    plan.fill(tensors, workers_usable(workers)[0])
    return resident_dataset(resident_info(plan, tensors, note), tensors)


def segment_attach(segment: Segment) -> Dataset:
    """Map the owner's file; it must still exist (the owner unlinks it only after everyone)."""
    size = os.stat(segment.path).st_size
    if size != segment.nbytes:
        raise RuntimeError(f"{segment.path} has {size} bytes, expected {segment.nbytes}")
    if segment.info is None:
        raise RuntimeError(f"{segment.path} carries no dataset facts")
    return resident_dataset(segment.info, _map(segment))


def segment_remove(path: Path | str | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def stale_segments_remove(shm_dir: Path = SHM_DIR) -> list[Path]:
    """Remove this user's segments whose owning process is gone (left by a SIGKILL)."""
    removed: list[Path] = []
    try:
        entries = list(shm_dir.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match:
            continue
        try:
            if entry.stat().st_uid != os.getuid() or _alive(int(match.group(1))):
                continue
            entry.unlink()
            removed.append(entry)
        except OSError:
            continue
    if removed:
        log.info("removed %d stale dataset segment(s) from %s", len(removed), shm_dir)
    return removed


def segments_of(owner_pid: int, shm_dir: Path = SHM_DIR) -> list[Path]:
    """The segments a run with this owner pid has in /dev/shm (none after it is done)."""
    try:
        return sorted(shm_dir.glob(f"{PREFIX}{owner_pid}-*"))
    except OSError:
        return []


@contextlib.contextmanager
def segment_owned(path: Path) -> Iterator[Path]:
    """Unlink ``path`` on the way out, whatever happens (SIGTERM arrives as SystemExit)."""
    try:
        yield path
    finally:
        segment_remove(path)


def shared_tensors_report(
    data: Dataset, shared_everywhere: Sequence[bool] | None = None
) -> list[SharedTensor]:
    """``started.shared_tensors`` entries for the dataset: is_shared is true only when every
    process reported its copy shared (``shared_everywhere``, one flag per tensor)."""
    tensors = dataset_tensors(data)
    flags = list(shared_everywhere) if shared_everywhere is not None else None
    out: list[SharedTensor] = []
    for i, (name, t) in enumerate(tensors.items()):
        shared = t.is_shared() if flags is None else flags[i]
        out.append(tensor_entry(name, t, shared))
    return out


def tensor_entry(name: str, t: torch.Tensor, shared: bool) -> SharedTensor:
    return {
        "name": name,
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "bytes": t.numel() * t.element_size(),
        "is_shared": bool(shared),
    }


def dataset_tensors(data: Dataset) -> dict[str, torch.Tensor]:
    """The resident tensors (none where the data streams); a text's bytes."""
    if isinstance(data.train, TextSplit) and isinstance(data.test, TextSplit):
        return dict(zip(TOKENS, (data.train.tokens, data.test.tokens), strict=True))
    if not isinstance(data.train, Split) or not isinstance(data.test, Split):
        return {}
    return {
        "train.images": data.train.images,
        "train.labels": data.train.labels,
        "test.images": data.test.images,
        "test.labels": data.test.labels,
    }


def shared_flags(data: Dataset) -> list[bool]:
    return [t.is_shared() for t in dataset_tensors(data).values()]


def with_path(segment: Segment, path: Path) -> Segment:
    return replace(segment, path=str(path))


def _map(segment: Segment) -> dict[str, torch.Tensor]:
    storage = cast(
        torch.UntypedStorage, torch.UntypedStorage.from_file(segment.path, True, segment.nbytes)
    )
    tensors = {}
    for spec in segment.tensors:
        dtype = _dtype(spec.dtype)
        t = torch.empty(0, dtype=dtype)
        # set_ counts the offset in elements of dtype; offsets are multiples of _ALIGN bytes.
        t.set_(storage, spec.offset // dtype.itemsize, spec.shape, _contiguous(spec.shape))
        tensors[spec.name] = t
    return tensors


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dataset_for_ranks(
    name: str, data_dir: Path, rt: Runtime, data_path: str | None = None, workers: int = 0
) -> tuple[Dataset, list[SharedTensor]]:
    """The dataset for a torchrun rank: resident as one shared copy per machine (or a private
    one per rank when /dev/shm cannot hold it, logged), or streaming on every rank where it
    does not fit the budget; rank 0's choice holds for all. Returns it with
    ``started.shared_tensors`` (none when streaming).

    Local rank 0 creates the segment; an all-gather then works as the barrier after which every
    rank maps the segment of its machine's local rank 0 (torchrun numbers the ranks of a machine
    contiguously, so that is global rank ``rank - local_rank``); a second all-gather collects
    every rank's is_shared() flags and marks the point after which local rank 0 may unlink.
    """
    plan = data_plan(name, data_dir, data_path)
    chosen: tuple[str, str] = all_gather(rt, mode_choose(plan))[0]
    mode, note = chosen
    if mode == "streaming":
        return streaming_dataset(plan, note, workers), []
    # Under torchrun the ranks' parent is the machine's agent: its pid names the file, so a
    # stale one can be told from a live one, and the run id keeps concurrent runs apart.
    path = segment_path(os.getppid(), f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}-{name}")
    owner = rt.local_rank == 0
    data: Dataset | None = None
    mine: Segment | None = None
    with contextlib.ExitStack() as cleanup:
        if owner:
            stale_segments_remove()
            cleanup.enter_context(segment_owned(path))
            try:
                data, mine = dataset_segment_create(plan, note, path, workers)
            except OSError as exc:
                log.warning("no shared copy of the dataset (%s); each rank loads its own", exc)
                segment_remove(path)
        segments: list[Segment | None] = all_gather(rt, mine)
        local = segments[rt.rank - rt.local_rank]
        if data is None:
            data = (
                segment_attach(with_path(local, path))
                if local
                else resident_private(plan, note, workers)
            )
        gathered: list[list[bool]] = all_gather(rt, shared_flags(data))
    everywhere = [all(flags[i] for flags in gathered) for i in range(len(gathered[0]))]
    log.info(
        "dataset tensors shared in rank %d: %s",
        rt.rank,
        dict(zip(dataset_tensors(data), shared_flags(data), strict=True)),
    )
    return data, shared_tensors_report(data, everywhere)


def text_for_ranks(
    name: str, data_dir: Path, rt: Runtime, data_path: str | None, seq_len: int
) -> tuple[Dataset, list[SharedTensor]]:
    """A text dataset for a torchrun rank, its bytes one shared copy per machine, as
    ``dataset_for_ranks`` keeps images: every rank reads the text (a few MB; a refusal comes
    alike on every rank, before any collective), the machine's local rank 0 copies its bytes
    into a segment, the others map it and let their own go."""
    text = text_read(name, data_dir, data_path)
    shapes = {key: ((len(data),), torch.uint8) for key, data in _text_parts(text).items()}
    path = segment_path(os.getppid(), f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}-{name}")
    tensors: dict[str, torch.Tensor] | None = None
    mine: Segment | None = None
    with contextlib.ExitStack() as cleanup:
        if rt.local_rank == 0:
            stale_segments_remove()
            cleanup.enter_context(segment_owned(path))
            try:
                tensors, mine = segment_create(path, shapes, lambda t: _text_fill(t, text))
            except OSError as exc:
                log.warning("no shared copy of the text (%s); each rank keeps its own", exc)
                segment_remove(path)
        local = all_gather(rt, mine)[rt.rank - rt.local_rank]
        if tensors is None and local is not None:
            tensors = _map(with_path(local, path))
        data = text_dataset(name, data_dir, data_path, seq_len, text=text, tensors=tensors)
        gathered: list[list[bool]] = all_gather(rt, shared_flags(data))
    everywhere = [all(flags[i] for flags in gathered) for i in range(len(gathered[0]))]
    return data, shared_tensors_report(data, everywhere)


def _text_parts(text: TextData) -> dict[str, bytes]:
    return dict(zip(TOKENS, (text.train, text.test), strict=True))


def _text_fill(tensors: dict[str, torch.Tensor], text: TextData) -> None:
    for key, data in _text_parts(text).items():
        tensors[key].copy_(text_tensor(data))
