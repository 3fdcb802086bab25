"""A run of realistic length on the server `make run` starts: its page's socket gets the whole
snapshot, then live messages, and stays open.

daphne (autobahn) applies --websocket-max-message-size to what it sends too: with the Procfile's
old 64 KiB, the snapshot of a 5-epoch Fashion-MNIST run (~4,700 steps) was refused, the socket
closed with 1011 and the page sat at "reconnecting...". The stack starts daphne with the
Procfile's own flags (dashboard/serving.py), so this checks the server users run.
"""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from websockets.sync.client import connect

from dashboard.serving import procfile_daphne_flags
from tests.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# 5 epochs of Fashion-MNIST's 60,000 images at batch 64: 938 steps an epoch.
STEPS = 4_690
KEYS = ("train_loss", "images_per_second", "lr", "data_seconds", "compute_seconds", "rss_bytes")
OLD_LIMIT = 64 * 1024  # the Procfile's message limit that broke this page

RUN_CREATE = f"""
from django.contrib.auth import get_user_model
from dashboard.management.commands.bench_charts import run_with_points_create
run = run_with_points_create(
    owner=get_user_model().objects.get(username="alice"), name="five epochs",
    steps={STEPS}, keys={KEYS!r},
)
print(run.pk, run.last_seq)
"""

GROUP_SEND = """
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from dashboard.experiments.runs.broadcast import experiment_group
message = {{"type": "log", "seq": {seq}, "level": "info", "message": "live after the snapshot"}}
async_to_sync(get_channel_layer().group_send)(
    experiment_group({pk}), {{"type": "run.events", "events": [message]}}
)
"""


def test_a_long_runs_socket_sends_its_whole_snapshot_then_live_messages(stack: Stack) -> None:
    pk, last_seq = map(int, stack.manage("shell", "-v", "0", "-c", RUN_CREATE).split())
    session = stack.login("alice")
    headers = {
        "Cookie": f"sessionid={session.cookies['sessionid']}",
        "Origin": stack.base_url,
    }
    url = f"{stack.ws_url}/ws/experiments/{pk}/"
    with connect(url, additional_headers=headers, open_timeout=15, max_size=None) as ws:
        raw = ws.recv(timeout=60, decode=False)
        snapshot = json.loads(raw)
        assert snapshot["type"] == "snapshot" and snapshot["seq"] == last_seq
        assert snapshot["experiment"]["id"] == pk
        # Every stored point is in it, bucketed (series.py's budget bounds its size).
        assert {key: snapshot["series"][key]["count"] for key in KEYS} == dict.fromkeys(KEYS, STEPS)
        # Larger than the old limit: this run is one the old Procfile broke.
        assert len(raw) > OLD_LIMIT
        stack.manage("shell", "-v", "0", "-c", GROUP_SEND.format(seq=last_seq + 1, pk=pk))
        live = json.loads(ws.recv(timeout=30))
        assert live["seq"] == last_seq + 1 and live["message"] == "live after the snapshot"
        # Still open: a ping is answered, nothing closes it.
        assert ws.ping().wait(10)
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1)


def test_incoming_messages_stay_bounded_and_runserver_matches_the_procfile() -> None:
    """Browsers send nothing on this channel: the limit that protects the server from large
    incoming messages stays, raised only as far as outgoing snapshots need (see Procfile)."""
    flags = procfile_daphne_flags()
    limits = dict(zip(flags[::2], map(int, flags[1::2]), strict=True))
    assert limits["--websocket-max-frame-size"] == OLD_LIMIT
    assert OLD_LIMIT < limits["--websocket-max-message-size"] <= 32 * 1024 * 1024
    assert limits == {
        "--websocket-max-message-size": settings.DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE,
        "--websocket-max-frame-size": settings.DAPHNE_WEBSOCKET_MAX_FRAME_SIZE,
    }
