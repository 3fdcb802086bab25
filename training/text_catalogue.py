"""What this machine can train a language model on, and with what: ``byte-llama``'s sizes, the
Jargon File, the users' text folders. The facts only, no torch: the CLI's choices and the
workers' reports (``training.catalogue``) read them, as the dashboard does.

``jargon``
    The Jargon File (version 4.4.7, public domain, 1.7 MB of UTF-8), from Debian's
    ``jargon-text`` (``apt-get install jargon-text``), or a copy at ``<data dir>/jargon.txt`` or
    ``$TRAINYARD_JARGON_FILE``. Its last tenth is held out for validation.
``textfolder``
    The user's ``.txt`` files in a folder under the text roots (``<data dir>/textfolders``, or a
    path of ``$TRAINYARD_TEXT_FOLDERS``), given with ``--data-path``: its ``train/`` and ``val/``
    (or ``test/``) files where it has both, else all of them, the last tenth held out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

BYTE_LLAMA = "byte-llama"
# Language models train on text (TEXT_DATASETS) only, and only they do.
LANGUAGE_MODELS = (BYTE_LLAMA,)
BYTE_VOCAB = 256  # the byte values: no tokenizer
# --seq-len's bounds, bytes a window: the CLI's and the launch form's (one home).
SEQ_LEN_BOUNDS = (8, 65536)

JARGON = "jargon"
TEXTFOLDER = "textfolder"
TEXT_DATASETS = (JARGON, TEXTFOLDER)
JARGON_ENV = "TRAINYARD_JARGON_FILE"
JARGON_DEBIAN = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
JARGON_INSTALL = "apt-get install -y jargon-text"
TEXT_ROOTS_ENV = "TRAINYARD_TEXT_FOLDERS"
TEXT_ROOTS_SUBDIR = "textfolders"
TEXT_EXTENSIONS = (".txt",)
EVAL_SPLITS = ("val", "test")
HELD_OUT = 0.1  # the tail held out for validation where the text has no split of its own


@dataclass(frozen=True)
class ByteLlamaSize:
    """A preset of ``byte-llama`` (``--model-size``)."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    seq_len: int  # --seq-len's default at this size
    help: str
    multiple_of: int = 32  # SwiGLU's hidden width is rounded up to a multiple of this

    @property
    def hidden_dim(self) -> int:
        """Llama's SwiGLU width: two thirds of 4 x dim, rounded up to ``multiple_of``."""
        hidden = int(2 * 4 * self.dim / 3)
        return -(-hidden // self.multiple_of) * self.multiple_of


BYTE_LLAMA_SIZES: dict[str, ByteLlamaSize] = {
    size.name: size
    for size in (
        ByteLlamaSize("smoke", 32, 2, 4, 32, "for tests: 2 layers of width 32 (43 K parameters)"),
        ByteLlamaSize(
            "small", 128, 4, 4, 128,
            "the default, for a CPU: 4 layers of width 128 (0.9 M parameters); on 2 cores "
            "its bits per byte halve in a few minutes",
        ),
        ByteLlamaSize(
            "medium", 512, 8, 8, 512, "for a GPU: 8 layers of width 512 (25 M parameters)",
            multiple_of=256,
        ),
        ByteLlamaSize(
            "large", 1024, 16, 16, 1024, "for GPUs: 16 layers of width 1024 (200 M parameters)",
            multiple_of=256,
        ),
    )
}  # fmt: skip
BYTE_LLAMA_SIZE_DEFAULT = "small"


def model_size_get(name: str | None) -> ByteLlamaSize:
    return BYTE_LLAMA_SIZES[name or BYTE_LLAMA_SIZE_DEFAULT]


def jargon_file(data_dir: Path) -> Path | None:
    """Where the Jargon File is here: ``$TRAINYARD_JARGON_FILE``, ``<data dir>/jargon.txt``
    (or .gz), Debian's; None where none is."""
    given = os.environ.get(JARGON_ENV, "").strip()
    candidates = [Path(given)] if given else []
    candidates += [data_dir / "jargon.txt", data_dir / "jargon.txt.gz", JARGON_DEBIAN]
    return next((path for path in candidates if path.is_file()), None)


def jargon_missing_message(data_dir: Path) -> str:
    return (
        f"the Jargon File is not on this machine: install Debian's jargon-text "
        f"({JARGON_INSTALL}), or put it at {data_dir / 'jargon.txt'} or ${JARGON_ENV}"
    )


def text_roots(data_dir: Path) -> list[Path]:
    """Where text folders are looked for: ``<data folder>/textfolders`` and each path of
    ``$TRAINYARD_TEXT_FOLDERS`` (os.pathsep-separated); each is a text folder itself or a
    folder of them (as ``training.catalogue.image_roots``)."""
    roots = [data_dir / TEXT_ROOTS_SUBDIR]
    extra = os.environ.get(TEXT_ROOTS_ENV, "")
    roots += [Path(part).expanduser() for part in extra.split(os.pathsep) if part.strip()]
    return roots


@dataclass(frozen=True)
class TextLayout:
    """A text folder's files: its own split (``train/`` and ``val/`` or ``test/``), or one list
    whose tail is held out."""

    path: str
    train: tuple[str, ...]
    held_out: tuple[str, ...]  # empty: the tail of ``train``'s text is held out
    layout: str  # "train/val", "train/test" or "one folder"
    bytes: int

    @property
    def files(self) -> int:
        return len(self.train) + len(self.held_out)


def text_files(folder: Path, inside: Path | None = None) -> list[Path]:
    """The ``.txt`` files under ``folder`` (its subfolders too, hidden ones not), by path; with
    ``inside`` (resolved), only those that are there once links are followed."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / f for f in files if f.lower().endswith(TEXT_EXTENSIONS)]
    return sorted(f for f in found if inside is None or _inside(f, inside))


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
    except (OSError, ValueError):
        return False
    return True


def text_layout(path: Path) -> TextLayout | None:
    """``path`` as a text folder, or None where it holds no text. Its files are those inside it
    once links are followed: the roots that the CLI holds ``--data-path`` to would mean nothing
    if a link in the folder (a ``train/`` or a ``.txt`` pointing elsewhere) could read any file
    the worker's user can."""
    if not path.is_dir():
        return None
    try:
        own = path.resolve()
        evaluation = next((path / s for s in EVAL_SPLITS if (path / s).is_dir()), None)
        if (path / "train").is_dir() and evaluation is not None:
            train, held = text_files(path / "train", own), text_files(evaluation, own)
            layout = f"train/{evaluation.name}"
        else:
            train, held, layout = text_files(path, own), [], "one folder"
        size = sum(f.stat().st_size for f in (*train, *held))
    except OSError:
        return None
    if not train or size == 0:
        return None
    names = (tuple(str(f) for f in train), tuple(str(f) for f in held))
    return TextLayout(str(path.resolve()), *names, layout=layout, bytes=size)


def text_folders(roots: Sequence[Path]) -> list[TextLayout]:
    """The text folders under ``roots`` (each root, or its subfolders, one level down)."""
    return folders_under(roots, text_layout)


class _Found(Protocol):
    @property
    def path(self) -> str: ...


Found = TypeVar("Found", bound=_Found)


def folders_under(roots: Sequence[Path], look: Callable[[Path], Found | None]) -> list[Found]:
    """What ``look`` finds at each root, or else in its subfolders (one level down), once per
    resolved path: image folders (``training.catalogue.image_folders``) and text folders."""
    found: dict[str, Found] = {}
    for root in roots:
        facts = look(root) if root.is_dir() else None
        if facts is not None:
            found.setdefault(facts.path, facts)
            continue
        try:
            children = sorted(p for p in root.iterdir() if p.is_dir())
        except OSError:
            continue
        for child in children:
            facts = look(child)
            if facts is not None:
                found.setdefault(facts.path, facts)
    return list(found.values())


def path_under(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path`` (resolved) lies inside one of ``roots`` (resolved)."""
    resolved = path.resolve()
    for root in roots:
        try:
            resolved.relative_to(root.resolve())
            return True
        except (OSError, ValueError):
            continue
    return False
