"""Stalled runs on the dashboard's side (issue 33, item 3): a script run's launcher says its ranks
stalled (protocol 1.13's `stalled` event), and steps again. Fed through the sink as the
supervisor feeds it (add, then events_flush): the row keeps it (one conditional update), the
log gets its line, the page's socket a `stalled` message, the read JSON and the page's banner
show it, the owner hears once where they asked; `since` null and the attempt's end clear it; an
event the dashboard cannot read breaks nothing. The launcher's side, with a real hung rank, is
tests/test_script_observer.py's.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core import mail
from django.test import Client

from dashboard.experiments.core import transitions
from dashboard.experiments.core.stalls import RESUME_NONE, STALLED_UNREAD, STEPS_AGAIN
from dashboard.experiments.core.transitions import Outcome
from dashboard.experiments.models import Experiment, LogLine, SeriesPoint, Status
from dashboard.experiments.runs.broadcast import experiment_group
from dashboard.experiments.runs.lifecycle import run_finish
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.stalls import MAX_STACK_CHARS
from dashboard.experiments.runs.stragglers import events_flush
from dashboard.notifications.models import Delivery, Kind, NotificationSettings
from tests.test_notifications import Receiver, eager, receiver  # noqa: F401 - fixtures
from tests.test_stragglers import _sent

pytestmark = pytest.mark.django_db(transaction=True)

SINCE, WAITING = 1796551322.0, 1796551384.25  # 10:02:02 and 10:03:04.25, 2026-12-06 UTC
TEXT = (
    "No step for 62 s: rank 1 never entered all_reduce #42; rank 0 waits in it since 10:03:04 UTC."
)
STACK_0 = 'Thread 0x7f (most recent call first):\n  File "train.py", line 40 in backward\n'
STACK_1 = 'Thread 0x7e (most recent call first):\n  File "train.py", line 31 in wait_for_nothing\n'
OVER = "The stall is over after 75 s: steps again."
# Each rank's line, the launcher's (training/observe/stall.py): rank 1's last collective is #41.
LINE_0 = "rank 0 waits in all_reduce #42 since 10:03:04 UTC"
LINE_1 = "rank 1 never entered all_reduce #42: its last, all_reduce #41, done"
STORED = {
    "since": "2026-12-06T10:02:02+00:00",
    "text": TEXT,
    "ranks": [
        {"rank": 0, "collective": "all_reduce #42", "entered": True, "stack": STACK_0,
         "waiting_since": "2026-12-06T10:03:04.250000+00:00", "line": LINE_0},
        {"rank": 1, "collective": "all_reduce #41", "entered": False, "stack": STACK_1,
         "waiting_since": None, "line": LINE_1},
    ],
}  # fmt: skip
LINES = [LINE_0, LINE_1]


def stalled(since: Any = SINCE, **fields: Any) -> dict[str, Any]:
    """A `stalled` event as the launcher writes it (training/observe/stall.py)."""
    ranks = [
        {"rank": 0, "collective": "all_reduce #42", "entered": True, "stack": STACK_0,
         "waiting_since": WAITING, "line": LINE_0},
        {"rank": 1, "collective": "all_reduce #41", "entered": False, "stack": STACK_1,
         "waiting_since": None, "line": LINE_1},
    ]  # fmt: skip
    return {"v": 1, "minor": 13, "run": "7", "seq": 9, "type": "stalled", "time": 80.5,
            "since": since, "ranks": [] if since is None else ranks, "text": TEXT,
            **fields}  # fmt: skip


def step(n: int) -> dict[str, Any]:
    return {"v": 1, "minor": 13, "run": "7", "seq": n, "type": "step", "epoch": 1, "step": n,
            "time": float(n), "train_loss": 1.0}  # fmt: skip


@pytest.fixture
def layer(settings: Any) -> Any:
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}
    }
    return get_channel_layer()


def listening(layer: Any, run: Experiment) -> str:
    """A channel in the run's group, as a page's consumer is."""
    channel: str = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(experiment_group(run.pk), channel)
    return channel


def feed(sink: EventSink, event: dict[str, Any]) -> None:
    """As the supervisor does with each event: add it, then flush (runner.py, test_stragglers)."""
    sink.add(event)  # type: ignore[arg-type]
    events_flush(sink=sink)


def sent_of(channel: str) -> list[dict[str, Any]]:
    """The messages the channel got since the last look, in order."""
    return [event for events in _sent(channel) for event in events]


def banner(page: str) -> str:
    """The stalled banner's opening tag and what follows it, up to the straggler's box."""
    start = page.index('id="stalled-box"')
    return page[start : page.index('id="straggler-box"', start)]


def test_a_stall_is_stored_logged_sent_shown_and_announced_once_then_cleared(
    layer: Any,
    user_factory: Any,
    experiment_factory: Any,
    receiver: Receiver,  # noqa: F811 - the fixture
) -> None:
    alice = user_factory(username="alice", email="alice@example.com")
    bob = user_factory(username="bob", email="bob@example.com")
    client = Client()
    client.force_login(alice)
    # Alice asks on the settings page (the form's new switch) by email, and by webhook.
    answer = client.post("/notifications/", {"email_enabled": "on", "stalled_enabled": "on"})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    # Her address verified (mail goes only to a verified one), as Bob's.
    NotificationSettings.objects.filter(user=alice).update(
        webhook_enabled=True, webhook_url=receiver.url, email_verified=alice.email
    )
    NotificationSettings.objects.create(
        user=bob, email_enabled=True, email_verified=bob.email
    )  # runs' ends only
    runs = {}
    for owner in (alice, bob):
        run = runs[owner.username] = experiment_factory(owner=owner, status=Status.RUNNING)
        channel, sink = listening(layer, run), EventSink(run)
        feed(sink, step(1))
        # Before any stall: null in the read JSON, the banner hidden (as for a run from before).
        if owner is alice:
            assert client.get(f"/api/experiments/{run.pk}/").json()["stalled"] is None
            page = client.get(f"/experiments/{run.pk}/").content.decode()
            assert 'aria-labelledby="stalled-title" hidden>' in banner(page)

        feed(sink, stalled())
        run.refresh_from_db()
        assert run.stalled == STORED
        [line] = LogLine.objects.filter(experiment=run, level="warning")
        assert line.message == TEXT and line.time == 80.5
        [said] = [m for m in sent_of(channel) if m["type"] == "stalled"]
        assert said["seq"] == line.seq and said["stalled"] == STORED
        assert (said["text"], said["level"], said["time"]) == (TEXT, "warning", 80.5)
        # With the banner's Stop and resume: no checkpoint here to resume from (core/stalls.py).
        assert said["texts"] == {
            "since": "stalled since 10:02:02 UTC", "ranks": LINES,
            "resume": {"resumable": False, "text": RESUME_NONE},
        }  # fmt: skip

        # Said again while stalled (another machine's launcher): replaced and said, not
        # announced again.
        again = stalled(text="No step for 70 s: the same.")
        feed(sink, again)
        run.refresh_from_db()
        assert run.stalled is not None and run.stalled["text"] == "No step for 70 s: the same."
        if owner is alice:
            body = client.get(f"/api/experiments/{run.pk}/").json()["stalled"]
            assert body["since"] == STORED["since"]
            assert [(r["rank"], r["entered"], r["stack"]) for r in body["ranks"]] == [
                (0, True, STACK_0), (1, False, STACK_1),
            ]  # fmt: skip
            # The list of runs says the stall, its stacks left to the run's own read.
            listed = client.get("/api/experiments/").json()["experiments"]
            [row] = [r for r in listed if r["id"] == run.pk]
            assert [(r["rank"], r["entered"], r["stack"]) for r in row["stalled"]["ranks"]] == [
                (0, True, ""), (1, False, ""),
            ]  # fmt: skip
            shown = banner(client.get(f"/experiments/{run.pk}/").content.decode())
            assert 'aria-labelledby="stalled-title">' in shown  # not hidden
            assert "No step for 70 s: the same." in shown and "stalled since 10:02:02 UTC" in shown
            for line_text in LINES:
                assert line_text in shown
            assert "in wait_for_nothing" in shown and "<summary>Python stack</summary>" in shown
            assert "data-run-stop>Stop</button>" in shown  # the page's Stop, here too

        feed(sink, stalled(since=None, text=OVER))
        run.refresh_from_db()
        assert run.stalled is None
        [over] = LogLine.objects.filter(experiment=run, level="info", message=OVER)
        cleared = [m for m in sent_of(channel) if m["type"] == "stalled"][-1]
        assert (cleared["stalled"], cleared["text"], cleared["level"]) == (None, OVER, "info")
        assert cleared["seq"] == over.seq and cleared["texts"] == {
            "since": "", "ranks": [], "resume": {"resumable": False, "text": ""},
        }  # fmt: skip
        # Said over twice: the row was clear already, nothing more in the log.
        feed(sink, stalled(since=None, text=""))
        assert LogLine.objects.filter(experiment=run, level="info").count() == 1
        late = [m for m in sent_of(channel) if m["type"] == "stalled"][-1]
        assert (late["stalled"], late["text"]) == (None, "")
        if owner is alice:
            page = client.get(f"/experiments/{run.pk}/").content.decode()
            assert 'aria-labelledby="stalled-title" hidden>' in banner(page)
            assert client.get(f"/api/experiments/{run.pk}/").json()["stalled"] is None
        # Every event became one message: a step, two stalls, two overs.
        assert Experiment.objects.get(pk=run.pk).last_seq == 5

    # Alice asked: one email and one webhook call, for the first stall, in the log's words; Bob
    # did not ask for stalls.
    [message] = mail.outbox
    assert message.to == ["alice@example.com"] and message.subject.endswith("is stalled")
    assert TEXT in message.body and f"/experiments/{runs['alice'].pk}/" in message.body
    assert sorted(Delivery.objects.values_list("kind", "channel")) == [
        (Kind.STALLED, "email"), (Kind.STALLED, "webhook"),
    ]  # fmt: skip
    [(_, body)] = receiver.got
    assert b'"event":"run.stalled"' in body and TEXT.encode() in body


def test_the_attempts_end_clears_the_stall_and_a_late_word_marks_nothing(
    layer: Any, user_factory: Any, experiment_factory: Any
) -> None:
    owner = user_factory()
    run = experiment_factory(owner=owner, status=Status.RUNNING)
    channel, sink = listening(layer, run), EventSink(run)
    feed(sink, stalled())
    run.refresh_from_db()
    assert run.stalled == STORED
    assert run_finish(experiment=run, sink=sink, outcome=Outcome(Status.CANCELLED, error="Stop"))
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.stalled is None
    # The end's own message says it: no stalled message of its own.
    assert [m["type"] for m in sent_of(channel)] == ["stalled", "failed"]
    # A launcher's word after the end (its last line read late) marks nothing, says nothing.
    feed(sink, stalled())
    run.refresh_from_db()
    assert run.stalled is None
    assert LogLine.objects.filter(experiment=run, level="warning").count() == 1
    [late] = sent_of(channel)
    assert (late["type"], late["stalled"], late["text"]) == ("stalled", None, "")

    # Lost (the reaper: no heartbeat) ends the attempt too.
    lost = experiment_factory(owner=owner, status=Status.RUNNING, attempt=1)
    feed(EventSink(lost), stalled())
    lost.refresh_from_db()
    assert lost.stalled is not None
    assert transitions.experiment_lose(experiment=lost, reason="silent", history=[])
    lost.refresh_from_db()
    assert lost.status == Status.LOST and lost.stalled is None


UNREAD: list[dict[str, Any]] = [
    {"since": "yesterday"},
    {"since": True},
    {"since": 1e300},  # past what a datetime holds
    {"since": float("nan")},
]


def test_a_stalled_event_it_cannot_read_breaks_nothing(
    layer: Any, user_factory: Any, experiment_factory: Any
) -> None:
    run = experiment_factory(owner=user_factory(), status=Status.RUNNING)
    channel, sink = listening(layer, run), EventSink(run)
    missing = stalled()
    del missing["since"]
    for event in [missing] + [stalled(**fields) for fields in UNREAD]:
        feed(sink, event)
    run.refresh_from_db()
    assert run.stalled is None
    lines = LogLine.objects.filter(experiment=run).values_list("level", "message")
    assert list(lines) == [("warning", STALLED_UNREAD)] * 5
    assert [m["type"] for m in sent_of(channel)] == ["log"] * 5

    # Readable `since`, the rest not what it says: the ranks that are ranks, within bounds.
    ranks = [
        "rank 0", {"rank": -1}, {"rank": True},
        {"rank": 3, "collective": 42, "entered": "yes", "stack": "x" * (3 * MAX_STACK_CHARS),
         "waiting_since": "10:00", "line": ["not", "words"]},
    ]  # fmt: skip
    feed(sink, stalled(ranks=ranks, text=None))
    run.refresh_from_db()
    assert run.stalled == {
        "since": STORED["since"],
        "text": "No step since 2026-12-06T10:02:02+00:00.",  # the launcher said no words
        "ranks": [{"rank": 3, "collective": "", "entered": False,
                   "stack": "x" * MAX_STACK_CHARS, "waiting_since": None, "line": ""}],
    }  # fmt: skip
    # The sink goes on storing the training's events.
    feed(sink, step(7))
    assert SeriesPoint.objects.filter(experiment=run, key="train_loss", step=7).exists()
    feed(sink, stalled(since=None, text=None))
    assert LogLine.objects.filter(experiment=run, message=STEPS_AGAIN).exists()
