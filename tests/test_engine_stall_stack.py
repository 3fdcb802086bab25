"""An engine run that hangs, through the whole stack (Redis, daphne, a Celery worker, torchrun
ranks; the session's stack, whose TRAINYARD_STALL_SECONDS is 8): rank 1 of a DDP run is stopped
by the test (SIGSTOP: its process lives and makes no step), rank 0's stall watch names it on the
run (read JSON `stalled`, log line, the page's banner), and the banner's "Stop and resume from
the last checkpoint", clicked in Chromium (POST /api/experiments/<id>/resume/), ends every
process of the attempt and queues the run again; its second attempt resumes from the epoch-1
checkpoint and succeeds. SQLite only: the restart's conditional updates are
tests/test_stall_resume.py's on either engine."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import psutil
import pytest

from tests.stack import Stack, wait_for
from tests.test_browser import browser, log_in, page  # noqa: F401 (fixtures)
from tests.test_survival_integration import assert_history_whole, launch, points

pytestmark = [
    pytest.mark.integration,
    pytest.mark.browser,
    pytest.mark.sqlite_only,
    pytest.mark.timeout(400),
]


def read(session: Any, stack: Stack, pk: int) -> dict[str, Any]:
    return dict(session.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=10).json())


def test_a_hung_engine_rank_is_named_and_the_run_resumes_from_its_checkpoint(
    stack: Stack,
    page: Any,  # noqa: F811 - the fixture
) -> None:
    alice = stack.login("alice")
    pk = launch(alice, stack, name="hangs", strategy="ddp", processes=2, epochs=3)
    wait_for(
        lambda: stack.query(
            "SELECT message FROM experiments_logline WHERE experiment_id = ? AND message LIKE ?",
            pk, "checkpoint of epoch 1 %",
        ),
        timeout=180, what="the first checkpoint",
    )  # fmt: skip
    rank1 = stack.experiment_row(pk)["run_info"]["pids"][1]
    hung = psutil.Process(rank1)
    hung.suspend()
    try:
        stalled = wait_for(lambda: read(alice, stack, pk)["stalled"], timeout=90,
                           what="the stall")  # fmt: skip
        waiting, stopped = stalled["ranks"]
        assert (waiting["rank"], stopped["rank"]) == (0, 1)
        assert waiting["entered"] is True and waiting["collective"], stalled
        assert stopped["stack"] == "(no stack: the process did not answer)"
        assert stalled["text"].startswith("No step for "), stalled
        # The row takes the stall at once; its log line comes with the sink's next flush.
        wait_for(lambda: stack.query(
            "SELECT message FROM experiments_logline WHERE experiment_id = ? AND level = ?"
            " AND message LIKE 'No step for %'", pk, "warning",
        ), timeout=15, what="the stall's log line")  # fmt: skip
        # Another user may not; the owner may, from the banner, and the attempt ends to be
        # queued again.
        bob = stack.login("bob")
        assert bob.post(f"{stack.base_url}/api/experiments/{pk}/resume/").status_code == 404
        resume_clicked(page, stack, pk)
        wait_for(lambda: not _alive(hung), timeout=60, what="the stopped rank ended")
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            os.kill(rank1, signal.SIGCONT)

    final = wait_for(
        lambda: (r := read(alice, stack, pk))["status"] in {"succeeded", "failed", "cancelled"}
        and r, timeout=300, what="the resumed run to end",
    )  # fmt: skip
    assert final["status"] == "succeeded", final["error"] + stack.diagnostics()
    assert final["attempt"] == 2 and final["stalled"] is None
    [ended, last] = final["attempts"]
    assert (ended["outcome"], last["outcome"]) == ("cancelled", "succeeded")
    assert ended["reason"].endswith("to resume from the last checkpoint."), ended
    # The second attempt started at epoch 2 from the epoch-1 checkpoint: every step once.
    assert stack.experiment_row(pk)["run_info"]["start_epoch"] == 2
    assert_history_whole(points(stack, pk), epochs=3)
    messages = [m for (m,) in stack.query(
        "SELECT message FROM experiments_logline WHERE experiment_id = ? ORDER BY seq, id", pk
    )]  # fmt: skip
    assert any(m.startswith("Stop and resume from the last checkpoint requested by alice")
               for m in messages), messages[-30:]  # fmt: skip


def resume_clicked(page: Any, stack: Stack, pk: int) -> None:  # noqa: F811 - the fixture
    """The run page as its owner: the banner with each rank's line and the button, which says
    the checkpoint it resumes from; clicked, the run is asked to stop and resume."""
    log_in(page, stack, "alice")
    page.goto(f"{stack.base_url}/experiments/{pk}/")
    page.wait_for_selector("#stalled-box:not([hidden])", timeout=20_000)
    assert "rank 1" in page.locator("#stalled-ranks li[data-rank='1']").inner_text()
    button = page.locator("#stalled-resume")
    assert button.is_enabled()
    said = page.locator("#stalled-resume-text").inner_text()
    assert "from the last checkpoint (step " in said, said
    button.click()
    # Asked (the attempts' record below says by whom and why): the button stays disabled.
    page.wait_for_function("() => document.getElementById('stalled-resume').disabled")
    assert page.locator("#stalled-resume-error").is_hidden()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
