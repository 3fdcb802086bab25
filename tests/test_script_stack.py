"""A user's own script through the whole stack: uploaded, launched through the API, watched,
asked for a checkpoint and stopped, or resumed from it on a new worker after its machine died
(Redis, daphne, a Celery worker, torchrun ranks).

The script is tests/scripts/plain_ddp/train.py (plain DDP, two Gloo ranks, `trainyard` inside);
the engine-side behaviour without the dashboard is tests/test_script_runs.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.stack import Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PLAIN_DDP = Path(__file__).resolve().parent / "scripts" / "plain_ddp"
OBSERVED = Path(__file__).resolve().parent / "scripts" / "observed"
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
TRAINYARD = Path(sys.executable).parent / "trainyard"


def folder_packed(folder: Path, *more: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path in (folder / "train.py", *more):
            archive.add(path, arcname=path.name)
    return out.getvalue()


def series_of(session: Any, stack: Stack, pk: int) -> dict[str, Any]:
    response = session.get(f"{stack.base_url}/api/experiments/{pk}/metrics/", timeout=10)
    return dict(response.json()["series"])


def test_an_uploaded_script_runs_reports_every_rank_and_stops_where_its_ranks_agree(
    stack: Stack,
) -> None:
    root = stack.login("root")  # staff: may run scripts
    packed = folder_packed(PLAIN_DDP)
    response = root.post(f"{stack.base_url}/api/code/",
                         files={"archive": ("code.tar.gz", packed)}, timeout=30)  # fmt: skip
    assert response.status_code == 201, response.text
    code = response.json()
    launched = root.post(f"{stack.base_url}/api/experiments/", timeout=30, json={
        "name": "my script", "strategy": "script", "processes": 2, "code": code["id"],
        "entrypoint": "train.py", "args": ["--steps", "100000", "--sleep", "0.05"],
    })  # fmt: skip
    assert launched.status_code == 201, launched.text
    run = launched.json()
    assert run["code_sha256"] == hashlib.sha256(packed).hexdigest() == code["sha256"]
    assert run["entrypoint"] == "train.py" and run["args"][:2] == ["--steps", "100000"]
    pk = run["id"]

    # Every rank's figures, and rank 0's as the run's own.
    wait_for(lambda: {"loss", "rank/0/loss", "rank/1/loss"} <= series_of(root, stack, pk).keys(),
             timeout=180, what="each rank's loss")  # fmt: skip
    row = stack.experiment_row(pk)
    launcher = psutil.Process(row["launcher_pid"])
    family = [launcher, *launcher.children(recursive=True)]
    assert len(family) >= 4  # the launcher, torchrun, two ranks

    asked = root.post(f"{stack.base_url}/api/experiments/{pk}/checkpoint/", timeout=10)
    assert asked.status_code == 202, asked.text
    checkpoints = f"{stack.base_url}/api/experiments/{pk}/checkpoints/"
    wait_for(lambda: root.get(checkpoints, timeout=10).json()["checkpoints"], timeout=60,
             what="the requested checkpoint")  # fmt: skip
    # A profile, as of an engine's run: every rank's trace, recorded by the observer.
    asked = root.post(f"{stack.base_url}/api/experiments/{pk}/profile/", json={"steps": 3},
                      timeout=10)  # fmt: skip
    assert asked.status_code == 202, asked.text
    latest = f"{stack.base_url}/api/experiments/{pk}/profiles/latest/"

    def profile_ended() -> dict[str, Any] | None:
        profile = root.get(latest, timeout=10).json()["profile"]
        return None if profile["in_flight"] else profile

    profile = wait_for(profile_ended, timeout=60, what="the profile")
    assert (profile["state"], profile["recorded_steps"]) == ("ready", 3), profile
    assert [t["rank"] for t in profile["traces"]] == [0, 1]
    assert all(s["ops"] for s in profile["summary"])

    stopped_and_gone(root, stack, pk, family)

    saved = root.get(checkpoints, timeout=10).json()["checkpoints"]
    assert len(saved) == 2, saved  # the one asked for, and the one the Stop saved
    last = max(c["step"] for c in saved)
    series = series_of(root, stack, pk)
    assert _last_step(series["rank/0/loss"]) == _last_step(series["rank/1/loss"]) == last
    logs = root.get(f"{stack.base_url}/api/experiments/{pk}/logs/", timeout=10).json()
    messages = [line["message"] for line in logs["lines"]]
    assert f"Stopped: 2 rank(s) left at step {last}." in messages, messages[-10:]
    assert logs["ranks"] == [0, 1]
    # Where each rank's steps went, measured by the observer (no line of the script asks it).
    read = root.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=10).json()
    assert [entry["rank"] for entry in read["breakdown"]] == [0, 1], read["breakdown"]
    for entry in read["breakdown"]:
        shares = [entry[name] for name in ("data", "forward", "backward", "optimizer",
                                           "communication", "other")]  # fmt: skip
        assert sum(shares) == pytest.approx(1, abs=0.05) and entry["backward"] > 0, entry
    assert {"rank/0/backward_seconds", "rank/1/communication_bytes"} <= series.keys()
    # And what each rank holds: the one-weight model's parameter and bias, float32.
    assert [(m["rank"], m["parameter_bytes"]) for m in read["memory"]] == [(0, 8), (1, 8)]
    for rank in (0, 1):  # each rank's own output, kept as its log
        own = root.get(f"{stack.base_url}/api/experiments/{pk}/logs/?rank={rank}", timeout=10)
        assert any(line["message"].startswith("step 1 loss") for line in own.json()["lines"])


def stopped_and_gone(root: Any, stack: Stack, pk: int, family: list[psutil.Process]) -> None:
    """Stop asked through the API: the run cancelled and every process of it gone."""
    stopped = root.post(f"{stack.base_url}/api/experiments/{pk}/stop/", timeout=10)
    assert stopped.status_code == 202, stopped.text
    final = wait_for(lambda: (r := stack.experiment_row(pk))["status"] != "running" and r,
                     timeout=90, what="the cancelled status")  # fmt: skip
    assert final["status"] == "cancelled"
    wait_for(lambda: not [p for p in family if _alive(p)], timeout=10, what="every process gone")


def _last_step(series: dict[str, Any]) -> int:
    return int(series["buckets"][-1][1])  # the last bucket's step_last


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def machine_crash(stack: Stack, launcher: psutil.Process) -> None:
    """The worker's machine dies with the run on it: every process of the worker, the launcher,
    torchrun and the ranks SIGKILLed, none given the time to save or say anything. The worker is
    stopped first: its supervisor would otherwise see its launcher die and settle the run."""
    os.killpg(stack.services["worker"].process.pid, signal.SIGSTOP)
    for process in [launcher, *launcher.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    stack.services["worker"].kill()


def test_a_script_whose_machine_died_resumes_from_its_checkpoint_on_a_new_worker(
    stack: Stack,
) -> None:
    root = stack.login("root")
    packed = folder_packed(PLAIN_DDP)
    code = root.post(f"{stack.base_url}/api/code/",
                     files={"archive": ("code.tar.gz", packed)}, timeout=30).json()  # fmt: skip
    steps = 120  # about 6 s of steps at least: the crash comes well before the end
    launched = root.post(f"{stack.base_url}/api/experiments/", timeout=30, json={
        "name": "survivor script", "strategy": "script", "processes": 2, "code": code["id"],
        "entrypoint": "train.py", "args": ["--steps", str(steps), "--sleep", "0.05"],
    })  # fmt: skip
    assert launched.status_code == 201, launched.text
    pk = launched.json()["id"]
    wait_for(lambda: "rank/1/loss" in series_of(root, stack, pk), timeout=180,
             what="the first steps")  # fmt: skip
    asked = root.post(f"{stack.base_url}/api/experiments/{pk}/checkpoint/", timeout=10)
    assert asked.status_code == 202, asked.text
    checkpoints = f"{stack.base_url}/api/experiments/{pk}/checkpoints/"
    [saved] = wait_for(lambda: root.get(checkpoints, timeout=10).json()["checkpoints"],
                       timeout=60, what="the requested checkpoint")  # fmt: skip
    launcher = psutil.Process(stack.experiment_row(pk)["launcher_pid"])
    past = "steps past the checkpoint, which the next attempt replaces"
    wait_for(lambda: _last_step(series_of(root, stack, pk)["rank/0/loss"]) > saved["step"],
             timeout=30, what=past)  # fmt: skip
    machine_crash(stack, launcher)
    stack.worker_start()  # as systemd would: the worker back, its run gone with the machine

    final = wait_for(lambda: (r := stack.experiment_row(pk))["status"] in {"succeeded", "failed"}
                     and r, timeout=240, what="the resumed run to end")  # fmt: skip
    ((attempt, attempts, error),) = stack.query(
        "SELECT attempt, attempts, error FROM experiments_experiment WHERE id = ?", pk
    )
    assert final["status"] == "succeeded", error + stack.diagnostics()
    assert attempt == 2 and [a["outcome"] for a in json.loads(attempts)] == ["lost", "succeeded"]
    # The script was handed the checkpoint (run.resume_path) and went on from its step: each
    # rank's points are every step once, those the lost attempt took past it replaced.
    messages = [message for (message,) in stack.query(
        "SELECT message FROM experiments_logline WHERE experiment_id = ? AND rank = 0"
        " ORDER BY seq, id", pk,
    )]  # fmt: skip
    resumed = f"resumed from {saved['path']} at step {saved['step']}"
    assert resumed in messages, messages[-20:]
    after = [m for m in messages[messages.index(resumed) :] if m.startswith("step ")]
    assert after[0].startswith(f"step {saved['step'] + 1} loss"), after[:3]
    for rank in (0, 1):
        stored = stack.query(
            "SELECT step FROM experiments_seriespoint WHERE experiment_id = ? AND key = ?"
            " ORDER BY id", pk, f"rank/{rank}/loss",
        )  # fmt: skip
        assert [step for (step,) in stored] == list(range(1, steps + 1))
        # The observer's windows go on from the checkpoint's step too (TRAINYARD_RESUME_STEP),
        # not from 1 again: each window's step once, in order, none past the last.
        windows = [step for (step,) in stack.query(
            "SELECT step FROM experiments_seriespoint WHERE experiment_id = ? AND key = ?"
            " ORDER BY id", pk, f"rank/{rank}/other_seconds",
        )]  # fmt: skip
        assert windows == sorted(set(windows)) and windows[-1] <= steps, windows
        assert any(step > saved["step"] for step in windows), windows


def test_trainyard_run_packs_the_folder_uploads_launches_and_watches(
    stack: Stack, tmp_path: Path
) -> None:
    folder = tmp_path / "my-project"
    folder.mkdir()
    shutil.copy(PLAIN_DDP / "train.py", folder)
    (folder / "notes.pt").write_text("not uploaded")
    (folder / ".gitignore").write_text("*.pt\n")
    token = stack.manage("create_token", "root").strip()
    env = {**os.environ, "TRAINYARD_URL": stack.base_url, "TRAINYARD_TOKEN": token}
    done = subprocess.run(  # noqa: S603
        [str(TRAINYARD), "run", "--nproc", "2", "train.py", "--", "--steps", "3"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "uploaded 2 files" in done.stderr  # train.py and .gitignore, not notes.pt
    pk = int(done.stdout.split("#")[1].split()[0])  # "run #12 succeeded"
    root = stack.login("root")
    detail = root.get(f"{stack.base_url}/api/experiments/{pk}/", timeout=10).json()
    assert detail["status"] == "succeeded" and detail["args"] == ["--steps", "3"]
    assert {"rank/0/loss", "rank/1/loss"} <= series_of(root, stack, pk).keys()


@pytest.mark.skipif(not FASHION.is_file(), reason="needs dataset-fashion-mnist")
def test_a_hung_rank_is_named_on_the_run_with_its_stack_and_a_stop_ends_every_process(
    stack: Stack,
) -> None:
    """tests/scripts/observed (no Trainyard line) with rank 1 asleep before step 5 for good:
    rank 0 waits in DDP's all-reduce. The stack's stall floor is 8 s (tests/stack.py)."""
    root = stack.login("root")
    packed = folder_packed(OBSERVED, OBSERVED.parent / "fashion.py")
    code = root.post(f"{stack.base_url}/api/code/",
                     files={"archive": ("code.tar.gz", packed)}, timeout=30).json()  # fmt: skip
    launched = root.post(f"{stack.base_url}/api/experiments/", timeout=30, json={
        "name": "hung script", "strategy": "script", "processes": 2, "code": code["id"],
        "entrypoint": "train.py",
        "args": ["--wrap", "ddp", "--epochs", "9", "--images", "1024", "--pause", "5:3600"],
    })  # fmt: skip
    assert launched.status_code == 201, launched.text
    pk = launched.json()["id"]
    detail = f"{stack.base_url}/api/experiments/{pk}/"
    stalled = wait_for(lambda: root.get(detail, timeout=10).json()["stalled"], timeout=120,
                       what="the run stalled")  # fmt: skip
    waiting, hung = stalled["ranks"]
    assert [(r["rank"], r["entered"]) for r in (waiting, hung)] == [(0, True), (1, False)]
    assert waiting["collective"].startswith("all_reduce #")
    assert hung["line"].startswith(f"rank 1 never entered {waiting['collective']}: its last, ")
    assert "in wait_for_nothing" in hung["stack"] and 'train.py", line' in waiting["stack"]
    assert stalled["since"][:4].isdigit()  # an ISO time
    logs = root.get(f"{detail}logs/", timeout=10).json()
    said = [line for line in logs["lines"] if line["message"].startswith("No step for ")]
    assert len(said) == 1 and "rank 1 never entered all_reduce #" in said[0]["message"], said
    alice = stack.login("alice")  # not hers: nothing of it
    assert alice.get(detail, timeout=10).status_code == 404

    family = [psutil.Process(stack.experiment_row(pk)["launcher_pid"])]
    family += family[0].children(recursive=True)
    stopped_and_gone(root, stack, pk, family)
    assert root.get(detail, timeout=10).json()["stalled"] is None  # an ended run is not stalled
