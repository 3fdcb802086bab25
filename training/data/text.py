"""Text for language models: the bytes of a split, resident, and the windows a step trains on.

A split is its bytes as one uint8 tensor (``TextSplit``); a window is ``seq_len + 1`` bytes from
any offset, the model reading the first ``seq_len`` and predicting each next byte. The vocabulary
is the 256 byte values, so there is no tokenizer: the text's UTF-8 bytes are the tokens.

Which windows a step trains on (``text_batches``): step ``s`` (global, 1-based) draws the whole
global batch's offsets, ``batch_size x accumulate x data-parallel ranks`` of them, from a
generator seeded with (seed, s) alone; data-parallel rank ``r`` takes the ``r``-th contiguous
slice. So a rank's windows depend only on seed, step and its data-parallel rank, and every
strategy at one global batch trains on the same windows: single at --batch-size 64, DDP over 2
ranks at 32, and tensor parallel at 64 (its ranks share one slice) alike, which is what lets
tests compare them for exactness. A resumed run draws what an uninterrupted one would.

Evaluation reads the held-out split in consecutive windows (``eval_starts``), each rank every
N-th, so the validation loss is the mean over every byte it predicts, exact for any number of
ranks.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from training.data.images import DataRefused
from training.text_catalogue import (
    HELD_OUT,
    JARGON,
    TEXTFOLDER,
    jargon_file,
    jargon_missing_message,
    text_layout,
)


@dataclass(frozen=True)
class TextSplit:
    """A split's bytes (uint8, resident) and the window length the model reads."""

    tokens: torch.Tensor
    seq_len: int

    def __len__(self) -> int:
        """Whole windows one pass over the split holds (its sequences, as images are counted)."""
        return max(0, (int(self.tokens.numel()) - 1) // self.seq_len)

    @property
    def starts(self) -> int:
        """How many offsets a window can start at."""
        return max(0, int(self.tokens.numel()) - self.seq_len)

    def windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows at byte offsets ``starts``: (inputs, next bytes), int64, batch x
        seq_len each."""
        index = starts.view(-1, 1) + torch.arange(self.seq_len + 1)
        window = self.tokens[index].to(torch.int64)
        return window[:, :-1], window[:, 1:]


@dataclass(frozen=True)
class TextData:
    """A text dataset's splits before its windows are known: bytes, and where they came from."""

    train: bytes
    test: bytes
    source: str
    notes: tuple[str, ...]


def text_read(name: str, data_dir: Path, data_path: str | None) -> TextData:
    """The bytes of ``jargon`` or of the text folder at ``data_path``, split; DataRefused says
    what is missing."""
    if name == JARGON:
        path = jargon_file(data_dir)
        if path is None:
            raise DataRefused(jargon_missing_message(data_dir))
        text = _read(path)
        train, test = _tail_held_out(text)
        source = f"the Jargon File 4.4.7 ({path}, {len(text):,} bytes)"
        return TextData(train, test, source, (_split_note(len(train), len(test)),))
    if name != TEXTFOLDER:
        raise DataRefused(f"{name} is not a text dataset")
    if not data_path:
        raise DataRefused(f"--dataset {TEXTFOLDER} needs --data-path DIR (a folder of .txt files)")
    layout = text_layout(Path(data_path).expanduser())
    if layout is None:
        raise DataRefused(f"--data-path {data_path} holds no .txt files with text in them")
    train = b"\n".join(_read(Path(f)) for f in layout.train)
    if layout.held_out:
        test = b"\n".join(_read(Path(f)) for f in layout.held_out)
        note = f"Validation: the {len(layout.held_out)} file(s) of its {layout.layout} folder."
    else:
        train, test = _tail_held_out(train)
        note = _split_note(len(train), len(test))
    source = (
        f"text folder {layout.path} ({layout.layout}; {layout.files} files, {layout.bytes:,} bytes)"
    )
    return TextData(train, test, source, (note,))


def _read(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def _tail_held_out(text: bytes) -> tuple[bytes, bytes]:
    cut = len(text) - int(len(text) * HELD_OUT)
    return text[:cut], text[cut:]


def _split_note(train: int, test: int) -> str:
    return (
        f"Validation: the text's last {HELD_OUT:.0%} ({test:,} bytes), training on the "
        f"{train:,} before it."
    )


TOKENS = ("train.tokens", "test.tokens")  # the splits' tensors, as shared memory names them


def text_splits(
    text: TextData, seq_len: int, tensors: dict[str, torch.Tensor] | None = None
) -> tuple[TextSplit, TextSplit]:
    """Both splits, on ``tensors`` where given (a shared copy of the bytes, ``TOKENS``), else on
    tensors of their own; refused (DataRefused) where one is shorter than a window."""
    splits = []
    for name, what, data in zip(TOKENS, ("training", "validation"), (text.train, text.test),
                                strict=True):  # fmt: skip
        if len(data) < seq_len + 1:
            raise DataRefused(
                f"the {what} text has {len(data):,} bytes, fewer than one window of --seq-len "
                f"{seq_len} plus the byte it predicts"
            )
        tokens = tensors[name] if tensors is not None else text_tensor(data)
        splits.append(TextSplit(tokens, seq_len))
    return splits[0], splits[1]


def text_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def text_batches(
    split: TextSplit,
    *,
    batch_size: int,
    count: int,
    rank: int,
    seed: int,
    first_step: int,
    steps: int,
    accumulate: int = 1,
) -> list[torch.Tensor]:
    """This data-parallel rank's window offsets for ``steps`` steps from global step
    ``first_step`` (1-based): slice ``rank`` of ``count`` of each step's global batch."""
    if not 0 <= rank < count:
        raise ValueError(f"rank {rank} is not in a world of {count}")
    global_size = batch_size * accumulate * count
    batches = []
    for step in range(first_step, first_step + steps):
        generator = torch.Generator().manual_seed(step_seed(seed, step))
        # Offsets 0 .. starts - 1: a window needs seq_len + 1 bytes from its offset on.
        starts = torch.randint(0, split.starts, (global_size,), generator=generator)
        batches.append(starts.tensor_split(count)[rank])
    return batches


def step_seed(seed: int, step: int) -> int:
    """One generator seed for (seed, step), mixed by a hash: torch's CPU generator keeps only
    32 bits of its seed, so ``seed x 2^32 + step`` would lose the seed."""
    return _mixed(f"{seed}/{step}")


def sample_seed(seed: int, epoch: int) -> int:
    """The seed of the text sample written after ``epoch``: mixed as ``step_seed`` is, under a
    label of its own, so distinct (seed, epoch) pairs draw apart (``seed + epoch`` gave seed 1
    epoch 2 the sample of seed 2 epoch 1) and no sample replays a step's windows."""
    return _mixed(f"sample/{seed}/{epoch}")


def _mixed(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**32


def eval_starts(split: TextSplit, rank: int, count: int) -> torch.Tensor:
    """Rank ``rank``'s share of the held-out split's consecutive windows: every ``count``-th."""
    return torch.arange(rank, len(split), count) * split.seq_len
