"""srun's output made back into its tasks' lines, exactly.

srun relays what each task writes as slurmstepd sends it (Slurm's slurmstepd/io.c,
_task_build_message): whole lines, but a line longer than its message (MAX_MSG_LEN, 1024 bytes,
fixed when Slurm is built: no option changes it) in pieces, and other tasks' lines may come
between them. Unlabelled, srun writes a piece as it came, so a cut line's head runs into the
next task's line and nothing tells them apart (an 8-rank step event, several KB, came in a
dozen pieces). With --label (srun_command) srun writes each piece as a line of its own, led by
its task's number, and adds the newline a cut piece lacks (common/write_labelled_message.c).
The stepd cuts a line only when 1023 bytes of it hold no newline, and then sends exactly 1024
bytes: a piece of 1024 bytes goes on in its task's next piece, a shorter one ends its line.
So each task's pieces are joined here, per stream, with no guessing.

That holds for srun's buffered I/O, its default (--unbuffered sends whatever a read gave).
The stream is read with errors="surrogateescape" (training_popen): a piece may end inside a
character, and its bytes come back whole here before the joined line is decoded.
"""

from __future__ import annotations

import re

PIECE_BYTES = 1024  # MAX_MSG_LEN (common/io_hdr.h): the size of every cut piece
LABEL = re.compile(r" *(\d+): ")  # "%*d: ", padded to the widest task number
ENCODING = "utf-8"


class TaskLines:
    """One of srun's streams (stdout or stderr): its labelled pieces in, tasks' lines out."""

    def __init__(self) -> None:
        self.held: dict[str, list[bytes]] = {}  # by task number: its cut line's pieces so far

    def take(self, line: str | None) -> list[str | None]:
        """The whole lines `line` completes, unlabelled: none while its task's line is cut. At
        the stream's end (None), what is held, then None."""
        if line is None:
            rest = [_decoded(pieces) for pieces in self.held.values()]
            self.held = {}
            return [*rest, None]
        label = LABEL.match(line)
        if label is None:
            return [line]  # srun's own messages ("srun: error: ..."), never cut
        piece = line[label.end() :].removesuffix("\n").encode(ENCODING, "surrogateescape")
        pieces = [*self.held.pop(label.group(1), []), piece]
        if len(piece) == PIECE_BYTES:
            self.held[label.group(1)] = pieces
            return []
        return [_decoded(pieces)]


def _decoded(pieces: list[bytes]) -> str:
    return b"".join(pieces).decode(ENCODING, "replace") + "\n"
