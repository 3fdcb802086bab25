"""A run, live over its WebSocket (/ws/experiments/<id>/): a progress bar with epoch, step, loss
and accuracy, until the run ends.

The server sends a `snapshot`, then messages numbered by `seq`. Anything at or below what we have
is dropped; a gap, or a socket that breaks, means reconnect and start from a new snapshot, so
nothing is missed when the server's channel layer drops a message.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import urlsplit

from tqdm import tqdm
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from trainyard.api import Api, ApiError

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
# Without a message for this long, ask the API whether the run ended (a run stopped while queued
# ends without a message on its channel).
QUIET_SECONDS = 5.0
MAX_RECONNECTS = 20


class Resync(Exception):
    """A gap in `seq` or a broken socket: start again from a snapshot."""


@dataclass
class Watch:
    """What one `watch` has seen so far, and its bar."""

    pk: int
    stream: IO[str]
    show_logs: bool = False
    only_logs: bool = False
    seq: int = 0
    status: str = ""
    epochs: int = 0
    bar: Any = None
    postfix: dict[str, str] = field(default_factory=dict)
    # Snapshots and messages taken: a connection that got any was working before it broke.
    taken: int = 0

    def say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def bar_open(self, *, total: int | None, step: int) -> None:
        if self.only_logs or self.bar is not None:
            return
        self.bar = tqdm(
            total=total or None,
            initial=step,
            unit="step",
            desc=f"#{self.pk}",
            file=self.stream,
            dynamic_ncols=True,
            mininterval=0.2,
        )

    def bar_total(self, total: Any) -> None:
        # A bar opened before the run started (its snapshot said running) learns its length
        # from the `started` event.
        if self.bar is not None and isinstance(total, int) and total > 0:
            self.bar.total = total
            self.bar.refresh()

    def progress(self, *, epoch: int | None, step: int | None) -> None:
        if self.bar is None or step is None:
            return
        if epoch:
            self.bar.set_description(f"#{self.pk} epoch {epoch}/{self.epochs}", refresh=False)
        # A resumed attempt replays steps: the bar follows it back.
        self.bar.n = step
        self.bar.set_postfix(self.postfix, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _loss_text(value: Any) -> str | None:
    return f"{value:.4g}" if isinstance(value, int | float) else None


def snapshot_take(watch: Watch, message: dict[str, Any]) -> None:
    experiment = message.get("experiment") or {}
    watch.taken += 1
    watch.seq = int(message.get("seq") or 0)
    watch.status = str(experiment.get("status") or "")
    watch.epochs = int(experiment.get("epochs") or 0)
    if watch.only_logs or watch.show_logs:
        for line in message.get("logs") or []:
            watch.say(str(line.get("message", "")))
    if watch.status == "queued":
        reason = experiment.get("waiting_reason") or "waiting for a worker"
        watch.say(f"run #{watch.pk} queued: {reason}")
    if watch.status not in FINAL_STATUSES and watch.status != "queued":
        watch.bar_open(total=experiment.get("total_steps"), step=int(experiment.get("step") or 0))
        watch.progress(epoch=experiment.get("epoch"), step=experiment.get("step"))


def _started(watch: Watch, message: dict[str, Any]) -> None:
    watch.epochs = int(message.get("epochs") or watch.epochs)
    watch.bar_open(total=message.get("total_steps"), step=0)
    watch.bar_total(message.get("total_steps"))


def _status(watch: Watch, message: dict[str, Any]) -> None:
    watch.status = str(message.get("status") or watch.status)
    reason = f": {message['reason']}" if message.get("reason") else ""
    watch.say(f"run #{watch.pk} {watch.status}{reason}")


def _step(watch: Watch, message: dict[str, Any]) -> None:
    watch.bar_open(total=None, step=0)
    if (loss := _loss_text(message.get("train_loss"))) is not None:
        watch.postfix["loss"] = loss
    watch.progress(epoch=message.get("epoch"), step=message.get("step"))


def _epoch(watch: Watch, message: dict[str, Any]) -> None:
    accuracy = message.get("test_accuracy")
    if isinstance(accuracy, int | float):
        watch.postfix["acc"] = f"{accuracy:.1%}"
    watch.progress(epoch=message.get("epoch"), step=message.get("step"))


def _log(watch: Watch, message: dict[str, Any]) -> None:
    if watch.show_logs or watch.only_logs:
        watch.say(str(message.get("message", "")))


def _finished(watch: Watch, message: dict[str, Any]) -> None:
    watch.status = str(message.get("status") or "succeeded")


def _failed(watch: Watch, message: dict[str, Any]) -> None:
    watch.status = str(message.get("status") or "failed")


# One handler per message type, as the consumer sends them; other types are ignored.
HANDLERS = {
    "started": _started,
    "status": _status,
    "step": _step,
    "epoch": _epoch,
    "log": _log,
    "finished": _finished,
    "failed": _failed,
}


def message_take(watch: Watch, message: dict[str, Any]) -> None:
    """One live message; raises Resync on a gap."""
    seq = message.get("seq")
    if not isinstance(seq, int) or seq <= watch.seq:
        return
    if seq != watch.seq + 1:
        raise Resync(f"missed messages {watch.seq + 1}..{seq - 1}")
    watch.seq = seq
    watch.taken += 1
    handler = HANDLERS.get(str(message.get("type")))
    if handler is not None:
        handler(watch, message)


def socket_url(api: Api, pk: int, *, query: str = "") -> str:
    parts = urlsplit(api.url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path}/ws/experiments/{pk}/" + (
        f"?{query}" if query else ""
    )


def socket_open(api: Api, pk: int, *, query: str = "") -> ClientConnection:
    parts = urlsplit(api.url)
    headers = {
        "Authorization": str(api.session.headers["Authorization"]),
        # The server accepts sockets from its own origin only.
        "Origin": f"{parts.scheme}://{parts.netloc}",
    }
    return connect(
        socket_url(api, pk, query=query),
        additional_headers=headers,
        open_timeout=15,
        max_size=2**24,  # a snapshot of a long run is large
    )


def _session(api: Api, watch: Watch, *, query: str, follow: bool) -> bool:
    """One connection: True when the run ended (or, not following, after the snapshot)."""
    with socket_open(api, watch.pk, query=query) as ws:
        snapshot_take(watch, json.loads(ws.recv(timeout=30)))
        if watch.status in FINAL_STATUSES or not follow:
            return True
        while True:
            try:
                raw = ws.recv(timeout=QUIET_SECONDS)
            except TimeoutError:
                if api.experiment(watch.pk)["status"] in FINAL_STATUSES:
                    return True
                continue
            message_take(watch, json.loads(raw))
            if watch.status in FINAL_STATUSES:
                return True


def run_follow(
    api: Api,
    pk: int,
    *,
    stream: IO[str] = sys.stderr,
    show_logs: bool = False,
    only_logs: bool = False,
    follow: bool = True,
    query: str = "",
) -> dict[str, Any]:
    """Follow run `pk` until it ends (or only read its snapshot); returns the run as the API
    gives it then."""
    watch = Watch(pk=pk, stream=stream, show_logs=show_logs, only_logs=only_logs)
    failures = 0
    try:
        while True:
            taken = watch.taken
            try:
                if _session(api, watch, query=query, follow=follow):
                    break
            except InvalidStatus as exc:
                raise ApiError(exc.response.status_code, socket_refusal(exc)) from None
            except (Resync, ConnectionClosed, WebSocketException, OSError) as exc:
                # Only failures in a row count: a run of days sees many sockets that worked for
                # a while (a proxy's idle limit, a server restart) and must not give up on them.
                failures = 1 if watch.taken > taken else failures + 1
                if failures > MAX_RECONNECTS:
                    raise ApiError(0, f"lost the connection to run #{pk}: {exc}") from None
                time.sleep(min(0.5 * failures, 5))
    finally:
        watch.close()
    return api.experiment(pk)


def socket_refusal(exc: InvalidStatus) -> str:
    status = exc.response.status_code
    if status == 403:
        return "the server refused the live connection (a wrong token, or not your run?)"
    return f"the server refused the live connection (HTTP {status})"
