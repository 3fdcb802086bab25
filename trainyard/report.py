"""A script run outside Trainyard reporting to a server: `trainyard.init(url=..., token=...)`, or
TRAINYARD_URL (and TRAINYARD_TOKEN, else the token `trainyard login` saved for that server).

The ranks agree on a key for the run first: rank 0 draws it and every rank takes the largest of
the ranks' numbers in one all-reduce of the library's agreement (agree.py), so this needs the
script's process group set up before `init()`, as under a launch. Without one, rank 0 reports
and the other ranks get a quiet run, unless TRAINYARD_RUN_KEY gives every rank the same key
(the key is the run: a later `trainyard sync`, or a script started again with the same key,
reports to the same run). Each rank then finds or creates the run by that key through the API
(`run.id`: its id there) and keeps a spool (spool.py): every event is written there first, and
a thread of the library's own sends them in batches, in order, and notes what the server took.
A server that cannot be reached only delays them; at `finish()` the rest is sent for a bounded
time (TRAINYARD_FINISH_SECONDS, 30) and what is left is named on stderr with the command that
sends it. The answer of each post carries the dashboard's requests (a Stop, a checkpoint), which
the ranks agree on as they do under a launch (run.py).

Rank 0's `finish()` ends the run `succeeded` (`cancelled` after a Stop); an exception that ends
the script ends it `failed` (sys.excepthook), and a script that exits without `finish()` is
finished at exit (atexit).
"""

from __future__ import annotations

import atexit
import json
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from trainyard.agree import Agreement
from trainyard.api import Api, ApiError
from trainyard.channel import EventChannel
from trainyard.config import profile_resolve
from trainyard.spool import (
    MAX_EVENT_BYTES,
    RankSpool,
    SpoolInfo,
    batch_post,
    batch_take,
    run_find,
    spool_info_write,
    spool_root,
    transient,
)

SEND_GAP_SECONDS = 0.5  # events gather this long into one post (one transaction, one message)
POLL_SECONDS = 5.0  # with nothing to send, a post this often: a sign of life, and the requests
MAX_BACKOFF_SECONDS = 5.0  # between tries while the server cannot be reached
MAX_NAME_CHARS = 200
# A figure's name: the server keeps it as rank/<r>/<name> in 200 characters (ranks below 10**6).
MAX_FIGURE_NAME_CHARS = 188


def _storable(value: Any) -> Any:
    """The value with every string one the server can store (no NUL, no lone surrogate): a
    refused post would hold back every event after it."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_storable(str(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    return value


class ReportChannel:
    """This rank's events to the server, through its spool; what Run sends through (`send`,
    `close`), with the server's requests (`requests`) and the run's id there (`server_id`)."""

    def __init__(
        self, *, api: Api, info: SpoolInfo, folder: Path, rank: int, finish_seconds: float
    ):
        self.api, self.info, self.folder, self.rank = api, info, folder, rank
        self.finish_seconds = finish_seconds
        self.spool = RankSpool(folder, rank)
        self.writer = EventChannel(folder, rank=rank, run_id=info.key)
        self.writer.seq = self.spool.last_seq()  # a script started again with the same key
        self.server_id: int | None = None
        self.answer: dict[str, Any] = {}
        self.refused: ApiError | None = None  # a refusal no retry mends: sending stopped
        self.names_warned = False
        self.wake, self.closing = threading.Event(), threading.Event()
        # Set once close() gave up waiting: the thread leaves (a backoff's wait ends at once).
        self.abandoned = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="trainyard-report", daemon=True)

    def start(self) -> None:
        """Find the run once now (its id for `run.id`), then send from the thread."""
        try:
            self.server_id = run_find(api=self.api, info=self.info)
        except ApiError as exc:
            if not transient(exc):
                raise
            print(f"trainyard: {exc.message}; this run's events wait in {self.folder} and are "
                  "sent when the server answers", file=sys.stderr)  # fmt: skip
        self.thread.start()

    # ---- what Run calls --------------------------------------------------------------------
    def send(self, type_: str, **fields: Any) -> dict[str, Any]:
        fields = _storable(fields)
        if type_ == "metrics":
            fields["values"] = self._names_kept(fields["values"])
        size = len(json.dumps(fields))
        if size > MAX_EVENT_BYTES:
            raise ValueError(f"a {type_} event of {size} characters: at most {MAX_EVENT_BYTES}")
        event = self.writer.send(type_, **fields)
        self.wake.set()
        return event

    def _names_kept(self, values: dict[str, Any]) -> dict[str, Any]:
        """The figures whose names the server keeps (as rank/<r>/<name>): a longer one would
        have it refuse the whole batch, and every event after it would wait."""
        kept = {name: v for name, v in values.items() if 0 < len(name) <= MAX_FIGURE_NAME_CHARS}
        if len(kept) < len(values) and not self.names_warned:
            self.names_warned = True
            print(f"trainyard: figure names of 1 to {MAX_FIGURE_NAME_CHARS} characters only; "
                  "the others are not sent", file=sys.stderr)  # fmt: skip
        return kept

    def requests(self) -> dict[str, Any]:
        """The server's last word on the requests: {"stop": bool, "checkpoint": number}."""
        return self.answer

    def close(self) -> None:
        """Send what is left for a bounded time; say on stderr what could not be sent."""
        self.writer.close()
        self.closing.set()
        self.wake.set()
        self.thread.join(self.finish_seconds)
        self.abandoned.set()
        left = self.spool.unsent()
        if not left:
            self.spool.remove()
            return
        why = self.refused.message if self.refused else f"{self.api.url} did not take them"
        print(f"trainyard: rank {self.rank}: {left} event(s) not sent ({why}); they are kept "
              f"in {self.folder}. Send them with:\n  trainyard sync {self.folder}",
              file=sys.stderr)  # fmt: skip

    # ---- the thread --------------------------------------------------------------------------
    def _loop(self) -> None:
        pending: list[dict[str, Any]] = []
        backoff, poll_at = 0.0, 0.0
        while not self.abandoned.is_set():
            pending += self.spool.read_new()
            if self.closing.is_set() and not pending:
                return
            try:
                if pending or time.monotonic() >= poll_at:
                    pending = self._post(pending)
                    poll_at = time.monotonic() + POLL_SECONDS
                backoff = 0.0
            except ApiError as exc:
                if not transient(exc):
                    self._refused(exc)
                    return
                backoff = min(MAX_BACKOFF_SECONDS, max(0.5, backoff * 2))
            self._pause(backoff=backoff, more=len(pending) > 0)

    def _post(self, pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Post the first batch of `pending` (none: a post to ask for requests); what is left."""
        if self.server_id is None:
            self.server_id = run_find(api=self.api, info=self.info)
        batch = batch_take(pending) if pending else []
        self.answer = batch_post(api=self.api, run_id=self.server_id, spool=self.spool,
                                 batch=batch)  # fmt: skip
        return pending[len(batch) :]

    def _pause(self, *, backoff: float, more: bool) -> None:
        if backoff:  # the server is away: try again a while later, until close() gives up
            self.abandoned.wait(backoff)
        elif not more:  # (more: a full batch went, the next goes at once)
            self.wake.wait(POLL_SECONDS)
            self.wake.clear()
            # What comes next gathers a while: one post, one transaction, one page message.
            self.closing.wait(SEND_GAP_SECONDS)

    def _refused(self, exc: ApiError) -> None:
        self.refused = exc
        print(f"trainyard: the server refused this run's events ({exc.status}: {exc.message}); "
              f"they stay in {self.folder}", file=sys.stderr)  # fmt: skip


def _key_agree(agreement: Agreement, *, rank: int, env: Mapping[str, str]) -> str:
    """The run's key, the same on every rank ("" where this rank cannot learn rank 0's)."""
    if env.get("TRAINYARD_RUN_KEY"):
        return env["TRAINYARD_RUN_KEY"]
    drawn = secrets.randbits(62) | 1 if rank == 0 else 0
    number = agreement.largest(drawn)  # rank 0's: the others propose 0
    return f"{number:016x}" if number else ""


def report_open(
    *, url: str, token: str | None, name: str | None, env: Mapping[str, str], agreement: Agreement
) -> ReportChannel | None:
    """This rank's channel to the server (started), or None where this rank cannot join."""
    profile = profile_resolve(url=url, token=token)
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    key = _key_agree(agreement, rank=rank, env=env)
    if not key:
        print(f"trainyard: rank {rank} reports nothing: call trainyard.init() after "
              "init_process_group (rank 0 shares the run then), or give every rank the same "
              "TRAINYARD_RUN_KEY", file=sys.stderr)  # fmt: skip
        return None
    title = name or env.get("TRAINYARD_RUN_NAME") or Path(sys.argv[0] or "script").name
    info = SpoolInfo(key=key, url=profile.url, name=title.strip()[:MAX_NAME_CHARS] or "script run",
                     processes=world)  # fmt: skip
    folder = spool_root(dict(env)) / key
    spool_info_write(folder, info)
    channel = ReportChannel(
        api=Api(url=profile.url, token=profile.token), info=info, folder=folder, rank=rank,
        finish_seconds=float(env.get("TRAINYARD_FINISH_SECONDS", "30")),
    )  # fmt: skip
    channel.start()
    return channel


def hooks_install(run: Any) -> None:
    """A script that dies of an exception fails its run; one that exits without finish() is
    finished (`run`: trainyard.run.Run, whose channel is a ReportChannel)."""
    previous = sys.excepthook

    def failed(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)  # the traceback first: closing may wait for the server
        text = "".join(traceback.format_exception(kind, value, tb))
        _fail(run, error=f"{kind.__name__}: {value}", text=text)

    exit_ = sys.exit
    status: list[object] = []  # the code sys.exit was called with: atexit does not see it

    def exit_noted(code: str | int | None = None, /) -> NoReturn:
        status.append(code)
        exit_(code)

    def at_exit() -> None:
        code = status[-1] if status else None
        if run.finished:
            return
        if code not in (None, 0):  # sys.exit(1), an argparse error: the run failed
            _fail(run, error=f"the script exited with {code!r}", text="")
        else:
            run.finish()

    sys.excepthook = failed
    sys.exit = exit_noted
    atexit.register(at_exit)


def _fail(run: Any, *, error: str, text: str) -> None:
    """End the run `failed`: the event cut to what one event may weigh (a traceback of non-ASCII
    text grows up to 6 times as JSON), and said at all costs: a run must not stay running."""
    if run.finished:
        return
    run.finished = True
    budget = MAX_EVENT_BYTES // 8  # characters that fit whatever their escapes
    try:
        run.channel.send("failed", error=error[:2000], traceback=text[-budget:])
    except ValueError:
        run.channel.send("failed", error=error[:200], traceback="")
    run.channel.close()
