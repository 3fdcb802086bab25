"""`trainyard.init()` inside a user's script: figures per rank, a Stop and checkpoint requests
every rank agrees on, the checkpoint to resume from.

Under a Trainyard launch (`python -m training --strategy script`, what the dashboard and
`trainyard run` start) the launcher's environment says where this rank's events go
(TRAINYARD_EVENTS_DIR) and where requests are read (TRAINYARD_CONTROL); the rank's identity is
torchrun's (RANK, WORLD_SIZE), never an argument. Anywhere else `init()` returns a run that
reports nothing and is never asked to stop, so the same script runs under plain torchrun:
its collectives are still made (the agreement's all-reduce), so it behaves the same, as
Determined's dummy contexts do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainyard.agree import Agreement, Pace
from trainyard.channel import EventChannel, number_or_none

# Each `log` may carry this many figures at most (the dashboard stores no more of one event).
MAX_FIGURES = 256


class Control:
    """The launcher's requests, {"stop": bool, "checkpoint": count} ({} where there are none),
    read again only when the file changed: it is asked every step, and changes once a run or
    so (the launcher replaces it whole: a new one is a new inode)."""

    def __init__(self, path: str | None):
        self.path = path
        self.seen: tuple[int, int, int] | None = None
        self.found: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        if not self.path:
            return {}
        try:
            stat = os.stat(self.path)
            if (stat.st_ino, stat.st_mtime_ns, stat.st_size) != self.seen:
                with open(self.path, encoding="utf-8") as control:
                    found = json.load(control)
                self.found = found if isinstance(found, dict) else {}
                self.seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        except (OSError, ValueError):
            return {}  # not written yet, or being replaced: read it next time
        return self.found


class Run:
    """One rank's view of the run. Every rank calls the same methods at the same places."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        channel: Any = None,
        agreement: Agreement | None = None,
    ):
        """`channel`: where the events go instead of the launcher's (init's: a server's,
        report.py; it answers `requests()` and knows `server_id`), with the `agreement` its
        ranks already used (the one group of the library's own)."""
        env = dict(os.environ if env is None else env)
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        events = None if channel is not None else env.get("TRAINYARD_EVENTS_DIR")
        run_id = env.get("TRAINYARD_RUN_ID", "")
        self._launch_id = int(run_id) if events and run_id.isdigit() else None
        self.channel = channel or (
            EventChannel(events, rank=self.rank, run_id=run_id) if events else None
        )
        self.control = Control(env.get("TRAINYARD_CONTROL") if events else None)
        self.resume_path: str | None = env.get("TRAINYARD_RESUME_PATH") or None
        folder = env.get("TRAINYARD_CHECKPOINT_DIR")
        # Where the launcher keeps the run's checkpoints (None: the script chooses its own).
        self.checkpoint_dir: Path | None = Path(folder) if folder else None
        self.agreement = agreement or Agreement()
        every = env.get("TRAINYARD_AGREE_EVERY")
        self.pace = Pace(
            fixed=max(1, int(every)) if every else None,
            seconds=float(env.get("TRAINYARD_AGREE_SECONDS", "0.25")),
        )
        self.listening = False
        self.stopping = False
        self.stop_said = False
        self.requests_agreed = 0  # the checkpoint requests every rank has seen
        self.requests_answered = 0
        self.step = 0
        self.finished = False
        self._send("hello", pid=os.getpid(), world_size=self.world_size)

    @property
    def id(self) -> int | None:
        """The run's id on the server (None: a quiet run, or one reported from outside whose
        server has not answered yet)."""
        found = getattr(self.channel, "server_id", None)
        return found if isinstance(found, int) else self._launch_id

    def _send(self, type_: str, **fields: Any) -> None:
        if self.channel is not None:
            self.channel.send(type_, **fields)

    def _requests(self) -> dict[str, Any]:
        """The requests to agree on: what the server last answered (a run reported from
        outside), else the launcher's control file."""
        answered = getattr(self.channel, "requests", None)
        return answered() if callable(answered) else self.control.read()

    def log(self, values: dict[str, Any], *, step: int | None = None) -> None:
        """Figures of this rank at `step` (default: the last one logged, plus one): kept as
        rank/<rank>/<name>, and rank 0's as <name> too."""
        if not isinstance(values, dict) or len(values) > MAX_FIGURES:
            raise TypeError(f"log takes a dict of at most {MAX_FIGURES} figures")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
            raise TypeError(f"step must be a whole number >= 0, got {step!r}")
        self.step = self.step + 1 if step is None else step
        figures = {str(name): number_or_none(value) for name, value in values.items()}
        self._send("metrics", step=self.step, values=figures)

    def _agree(self) -> None:
        """At the calls the ranks agreed on (agree.py's Pace), one all-reduce agrees on the
        Stop, the checkpoint requests and the next such call, whichever of should_stop and
        checkpoint_requested asks: a script (or a framework's callback) asking both each step
        makes one collective, not two."""
        due, alone = self.pace.tick(), self.agreement.alone()
        if self.stopping or not (due or alone):
            return
        requests = self._requests()
        count = requests.get("checkpoint")
        asked = count if isinstance(count, int) and not isinstance(count, bool) else 0
        stop, agreed, every = self.agreement.largest_each(
            [1 if requests.get("stop") is True else 0, asked, -self.pace.proposal()]
        )
        # Alone, a rank's own pace is no agreement: the first call in a process group must be
        # due on every rank, however many calls each made before it.
        self.pace.agreed(1 if alone else -every)
        self.requests_agreed = max(self.requests_agreed, agreed)
        self.stopping = bool(stop)

    def should_stop(self, *, step: int | None = None) -> bool:
        """Whether the run was asked to stop: the same answer on every rank at the same call.
        Save, call checkpoint_saved, then leave the loop and call finish(). `step`: the step
        this rank is at, which the run's log says it stopped at (default: the last logged)."""
        if not self.listening:
            self.listening = True
            self._send("listening")  # the launcher may now wait for the ranks to agree on a Stop
        self._agree()
        if self.stopping and not self.stop_said:
            self.stop_said = True
            self._send("stopping", step=self.step if step is None else step)
        return self.stopping

    def checkpoint_requested(self) -> bool:
        """Whether a checkpoint was asked for (and not yet saved): the same answer on every
        rank at the same call. Save it, then call checkpoint_saved."""
        self._agree()
        return self.requests_agreed > self.requests_answered

    def checkpoint_saved(self, path: str | os.PathLike[str], *, step: int) -> None:
        """Say that the checkpoint at `path` holds the state after `step` (rank 0's word is
        the run's; each rank may call it). It answers a pending request."""
        answers = self.requests_agreed > self.requests_answered
        self.requests_answered = self.requests_agreed
        if self.rank == 0:
            self._send("checkpoint", epoch=0, step=int(step), path=str(Path(path).resolve()),
                       requested=answers, answers_request=answers)  # fmt: skip

    def finish(self) -> None:
        """The end of this rank's part: said once; the library's own group is ended."""
        if self.finished:
            return
        self.finished = True
        self._send("done", step=self.step, stopped=self.stopping)
        self.agreement.close()
        if self.channel is not None:
            self.channel.close()


_current: Run | None = None  # this process's run: the script's and the integrations' one


def init(url: str | None = None, token: str | None = None, name: str | None = None) -> Run:
    """This rank's run: reporting to its launcher under Trainyard; outside a launch, to the
    server `url` (or TRAINYARD_URL) names, with `token` (or TRAINYARD_TOKEN, or the token
    `trainyard login` saved for that server) as the run `name` (report.py); a quiet one
    elsewhere. One a process: a second call (the script's own beside a framework
    integration's) returns the same run until it is finished."""
    global _current
    if _current is None or _current.finished:
        _current = _run_open(url=url, token=token, name=name)
    return _current


def _run_open(*, url: str | None, token: str | None, name: str | None) -> Run:
    url = url or os.environ.get("TRAINYARD_URL")
    if os.environ.get("TRAINYARD_EVENTS_DIR") or not url:
        return Run()  # a launch's ranks report to their launcher, whatever the script says
    from trainyard.report import hooks_install, report_open  # requests: only where it is used

    agreement = Agreement()
    channel = report_open(url=url, token=token, name=name, env=os.environ, agreement=agreement)
    run = Run(channel=channel, agreement=agreement)
    if channel is not None:
        hooks_install(run)
    return run
