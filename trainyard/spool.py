"""A run's spool: where a script that reports from outside keeps its events until the server
has taken them, and what sends them (report.py's thread while the script runs, `trainyard sync`
after it ended offline).

One folder per run, named by the run's key (report.py): `run.json` (the key, the server, the
name and the ranks: what `trainyard sync` needs to find or create the run again; never the
token), and per rank `rank-<r>.jsonl`, the events as the rank wrote them (the launcher's format,
trainyard/channel.py: one JSON object a line, flushed per event), and `rank-<r>.sent`, the last
`seq` the server acknowledged. Events are sent in seq order from after that mark, so a batch
whose answer was lost is sent again and the server counts it as duplicates (its own mark per
rank: dashboard/experiments/runs/reported.py): nothing is lost, nothing stored twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainyard.api import Api, ApiError

RUN_FILE = "run.json"
RANK_FILE = re.compile(r"rank-(\d{1,6})\.jsonl")
# One post: the server takes 500 events and a 64 KiB body at most; kept under both.
MAX_BATCH_EVENTS = 500
MAX_BATCH_BYTES = 60_000
# One event alone must fit a post (report.py refuses a bigger one where it is logged).
MAX_EVENT_BYTES = 48_000
SEND_TIMEOUT_SECONDS = 10.0  # a post's answer: a server that hangs is retried, not waited on


class SpoolError(Exception):
    """A folder that is not a run's spool."""


@dataclass(frozen=True)
class SpoolInfo:
    """What `run.json` holds: enough to find the run again (the same key is the same run)."""

    key: str
    url: str
    name: str
    processes: int


def spool_root(env: dict[str, str]) -> Path:
    """TRAINYARD_SPOOL_DIR, else ~/.cache/trainyard/spool (XDG_CACHE_HOME's, where it is set)."""
    explicit = env.get("TRAINYARD_SPOOL_DIR")
    if explicit:
        return Path(explicit)
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainyard" / "spool"


def _replace_write(path: Path, text: str) -> None:
    """Write whole or not at all: a reader (another rank, `sync`) never sees half a file."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def spool_info_write(folder: Path, info: SpoolInfo) -> None:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    _replace_write(folder / RUN_FILE, json.dumps(asdict(info), indent=2) + "\n")


def spool_info_read(folder: Path) -> SpoolInfo:
    try:
        found = json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))
        return SpoolInfo(
            key=str(found["key"]), url=str(found["url"]), name=str(found["name"]),
            processes=int(found["processes"]),
        )  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpoolError(f"{folder} is not a run's spool (its {RUN_FILE}: {exc})") from None


def spool_ranks(folder: Path) -> list[int]:
    """The ranks with events in the folder, rank 0 last: its `done` ends the run, so the
    others' events are stored first."""
    ranks = [int(m[1]) for p in folder.glob("rank-*.jsonl") if (m := RANK_FILE.fullmatch(p.name))]
    return sorted(ranks, key=lambda rank: (rank == 0, rank))


def events_read(path: Path, *, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The events of the file's whole lines from `offset`, and the offset after them: a line
    still being written is left for the next read."""
    try:
        with open(path, "rb") as stream:
            stream.seek(offset)
            data = stream.read()
    except FileNotFoundError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    events = []
    for line in whole.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash: the events after it still go
        if isinstance(event, dict) and isinstance(event.get("seq"), int):
            events.append(event)
    return events, offset + len(whole)


class RankSpool:
    """One rank's events file and its mark, read on from where it was left."""

    def __init__(self, folder: Path, rank: int):
        self.events_path = folder / f"rank-{rank}.jsonl"
        self.mark_path = folder / f"rank-{rank}.sent"
        self.offset = 0  # bytes of the events file read so far (whole lines)
        self.sent = self.sent_read()

    def sent_read(self) -> int:
        try:
            return int(self.mark_path.read_text(encoding="utf-8").strip() or 0)
        except (OSError, ValueError):
            return 0

    def sent_write(self, seq: int) -> None:
        self.sent = seq
        _replace_write(self.mark_path, f"{seq}\n")

    def read_new(self) -> list[dict[str, Any]]:
        """The events written since the last read and not yet acknowledged."""
        events, self.offset = events_read(self.events_path, offset=self.offset)
        return [event for event in events if event["seq"] > self.sent]

    def unsent(self) -> int:
        """Events of the file the server has not acknowledged."""
        return sum(event["seq"] > self.sent for event in events_read(self.events_path)[0])

    def last_seq(self) -> int:
        """The last seq written (0: none): a rank that writes on after a restart goes on from
        it, so that the server takes its new events as new."""
        return max((event["seq"] for event in events_read(self.events_path)[0]), default=0)

    def remove(self) -> None:
        """Everything acknowledged: the files go (the folder too, once no rank's are left)."""
        for path in (self.events_path, self.mark_path):
            path.unlink(missing_ok=True)
        if not any(self.events_path.parent.glob("rank-*.jsonl")):
            (self.events_path.parent / RUN_FILE).unlink(missing_ok=True)
            # Another rank's files, or a stray one of the user's: left as they are.
            with contextlib.suppress(OSError):
                self.events_path.parent.rmdir()


def batch_take(pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first events of `pending` that fit one post (at least one)."""
    size, count = len('{"events": []}'), 0
    for event in pending[:MAX_BATCH_EVENTS]:
        size += len(json.dumps(event)) + 2
        if count and size > MAX_BATCH_BYTES:
            break
        count += 1
    return pending[:count]


@dataclass
class Sent:
    """What the server said of the posts so far: events new to it, events it had already."""

    stored: int = 0
    duplicates: int = 0


def batch_post(
    *, api: Api, run_id: int, spool: RankSpool, batch: list[dict[str, Any]]
) -> dict[str, Any]:
    """Post one batch and move the rank's mark past it once the server has answered."""
    answer = dict(api.request("POST", f"/api/experiments/{run_id}/events/",
                              json={"events": batch}, timeout=SEND_TIMEOUT_SECONDS))  # fmt: skip
    if batch:
        spool.sent_write(int(batch[-1]["seq"]))
    return answer


def rank_send_all(*, api: Api, run_id: int, spool: RankSpool) -> Sent:
    """Send every event of the rank's file not yet acknowledged (`trainyard sync`); raises
    ApiError where the server refuses or cannot be reached (what was sent stays sent)."""
    sent, pending = Sent(), spool.read_new()
    while pending:
        batch = batch_take(pending)
        answer = batch_post(api=api, run_id=run_id, spool=spool, batch=batch)
        sent.stored += int(answer.get("stored", 0))
        sent.duplicates += int(answer.get("duplicates", 0))
        pending = pending[len(batch) :]
    return sent


def run_find(*, api: Api, info: SpoolInfo) -> int:
    """The run's id on the server: created from the spool's key if it is new, else found."""
    body = {"key": info.key, "name": info.name, "processes": info.processes}
    return int(api.request("POST", "/api/experiments/report/", json=body,
                           timeout=SEND_TIMEOUT_SECONDS)["id"])  # fmt: skip


def transient(error: ApiError) -> bool:
    """A failure worth trying again later: no answer, the server's own trouble (a 5xx, a
    server being restarted), or too many requests; any other refusal stays one."""
    return error.status in {0, 429} or error.status >= 500
