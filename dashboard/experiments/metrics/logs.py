"""Reading a run's log: by rank and level, a page at a time, or whole as text.

Lines are stored by the sink (rank 0's log events, and every rank's stderr lines with the rank
torchrun's prefix or their marker says, and the level their marker says, see
training/protocol.py); this module only reads them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from django.db.models import QuerySet

from dashboard.experiments.core.log_noise import NOISE_LEVEL
from dashboard.experiments.models import Experiment, LogLine

# How bad a level is, to filter by "this level or worse". Plain output has no level of its own:
# stdout counts as info, stderr (tracebacks, torchrun's own lines) as a warning; a library's
# known-harmless lines (core/log_noise.py) as less than debug.
LEVEL_SEVERITY: Final = {
    NOISE_LEVEL: 5,
    "debug": 10,
    "info": 20,
    "stdout": 20,
    "warning": 30,
    "stderr": 30,
    "error": 40,
    "critical": 50,
}
LOG_PAGE_DEFAULT: Final = 500
LOG_PAGE_MAX: Final = 5000


@dataclass(frozen=True)
class LogFilter:
    rank: int | None = None  # one rank's lines only
    level: str | None = None  # this level or worse (a key of LEVEL_SEVERITY)

    def levels(self) -> list[str] | None:
        if self.level is None:
            return None
        floor = LEVEL_SEVERITY[self.level]
        return [name for name, severity in LEVEL_SEVERITY.items() if severity >= floor]


@dataclass(frozen=True)
class LogPage:
    lines: list[LogLine]
    more: bool  # lines after the last one here


def log_lines_filtered(*, experiment: Experiment, where: LogFilter) -> QuerySet[LogLine]:
    lines = LogLine.objects.filter(experiment=experiment)
    if where.rank is not None:
        lines = lines.filter(rank=where.rank)
    levels = where.levels()
    if levels is not None:
        lines = lines.filter(level__in=levels)
    return lines.order_by("seq", "id")


def log_lines_page(
    *, experiment: Experiment, where: LogFilter, after: int | None, limit: int
) -> LogPage:
    """Up to ``limit`` lines after seq ``after``, oldest first. Several lines can share a seq
    (a started event's notes): a page never ends inside one, so ``after=<last seq>`` is a
    cursor that loses nothing."""
    lines = log_lines_filtered(experiment=experiment, where=where)
    if after is not None:
        lines = lines.filter(seq__gt=after)
    page = list(lines[: limit + 1])
    if len(page) <= limit:
        return LogPage(lines=page, more=False)
    page = page[:limit]
    last = page[-1]
    rest = list(lines.filter(seq=last.seq, id__gt=last.id))
    page += rest
    return LogPage(lines=page, more=lines.filter(seq__gt=last.seq).exists())


def log_ranks(*, experiment: Experiment) -> list[int]:
    """The ranks that have lines in this run's log, in order."""
    ranks = (
        LogLine.objects.filter(experiment=experiment, rank__isnull=False)
        .values_list("rank", flat=True)
        .distinct()
        .order_by("rank")
    )
    return [int(rank) for rank in ranks]


def log_line_text(line: LogLine) -> str:
    """One line of the downloaded log: seconds since the start, rank, level, message."""
    rank = "-" if line.rank is None else str(line.rank)
    return f"{line.time:10.1f}s rank {rank:>2} {line.level.upper():<8}| {line.message}\n"


def log_text_lines(*, experiment: Experiment, where: LogFilter) -> Iterator[str]:
    """The whole (filtered) log as text lines, read in chunks so that a long log streams."""
    yield f"# run #{experiment.pk} {experiment.name}: time since start, rank, level | message\n"
    for line in log_lines_filtered(experiment=experiment, where=where).iterator(chunk_size=2000):
        yield log_line_text(line)
