"""A user's own script as a run (`python -m training --strategy script`), as the worker starts it:
the launcher over torchrun, the `trainyard` library inside each rank, no dashboard.

tests/scripts/plain_ddp/train.py is a plain DDP script (Gloo, two ranks, its own model and
synthetic task) with the library's lines in it; the same file runs under plain torchrun.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from training.config import parse_args
from trainyard import agree
from trainyard.run import Run

ROOT = Path(__file__).resolve().parent.parent
PLAIN_DDP = ROOT / "tests" / "scripts" / "plain_ddp"
WAIT_SECONDS = 120


def _env() -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TRAINYARD_EVENTS_DIR", "TRAINYARD_CONTROL")
    return {k: v for k, v in os.environ.items() if k not in drop}


class Launched:
    """A launcher started as the worker starts it, its events read as they come."""

    def __init__(self, tmp_path: Path, *flags: str, code: Path = PLAIN_DDP, args: list[str]):
        command = [sys.executable, "-m", "training", "--strategy", "script", "--run-id", "7",
                   "--code-dir", str(code), "--checkpoint-dir", str(tmp_path / "checkpoints"),
                   *flags, "--", *args]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=ROOT, env=_env(), text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        self.events: list[dict[str, Any]] = []
        self.arrived: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            event = json.loads(line)
            self.events.append(event)
            self.arrived.put(event)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def wait_for(self, check: Any) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                event = self.arrived.get(timeout=1)
            except queue.Empty:
                assert self.process.poll() is None, self.stderr
                continue
            if check(event):
                return event
        raise AssertionError(f"no such event in {WAIT_SECONDS} s: {self.events[-5:]}")

    def end(self) -> int:
        returncode = self.process.wait(timeout=WAIT_SECONDS)
        time.sleep(0.2)  # the reader threads take the last lines
        return returncode

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    def steps(self, rank: int) -> list[int]:
        return [e["step"] for e in self.of_type("metrics") if e["rank"] == rank]


def test_a_script_runs_as_ranks_with_figures_and_logs_of_each_rank(tmp_path: Path) -> None:
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", args=["--steps", "3"])
    assert run.end() == 0, run.stderr
    started = run.of_type("started")[0]
    assert started["strategy"] == "script" and started["world_size"] == 2
    script = {k: v for k, v in started["script"].items() if k not in ("packages", "git")}
    assert script == {"entrypoint": "train.py", "args": ["--steps", "3"],
                      "code_dir": str(PLAIN_DDP), "stop_grace": 60.0}  # fmt: skip
    # What ran with it: the packages as pip freeze lists them, the repository's commit.
    assert f"torch=={started['torch_version']}" in started["script"]["packages"]
    assert len(started["script"]["git"]["commit"]) == 40
    assert started["stop_pid"] == started["requests_pid"] == run.process.pid
    assert run.steps(0) == run.steps(1) == [1, 2, 3]
    figures = run.of_type("metrics")[0]["values"]
    assert set(figures) == {"loss", "weight"}
    assert all(isinstance(v, float) for v in figures.values())
    assert run.of_type("finished")[0]["steps"] == 3
    # Each rank's own output is its log, marked with the rank that wrote it.
    for rank in (0, 1):
        assert f"rank {rank} STDOUT | step 3 loss" in run.stderr
    assert [e["seq"] for e in run.events] == list(range(1, len(run.events) + 1))


def test_the_same_script_runs_under_plain_torchrun(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "train.py", "--steps", "2"]  # fmt: skip
    env = {**_env(), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=PLAIN_DDP, env=env, capture_output=True, text=True,
                          timeout=WAIT_SECONDS)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step 2 loss" in done.stdout
    assert not list(PLAIN_DDP.glob("*.pt")) and not list(PLAIN_DDP.glob("rank-*.jsonl"))


def test_checkpoint_and_stop_are_agreed_by_every_rank_and_the_run_resumes(tmp_path: Path) -> None:
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py",
                   args=["--steps", "100000", "--sleep", "0.05"])  # fmt: skip
    run.wait_for(lambda e: e["type"] == "metrics" and e["step"] >= 2)
    family = [psutil.Process(run.process.pid), *psutil.Process(run.process.pid).children(True)]
    run.process.send_signal(signal.SIGUSR1)
    asked = run.wait_for(lambda e: e["type"] == "checkpoint")
    assert asked["requested"] is True and asked["answers_request"] is True
    assert Path(asked["path"]).is_file()
    run.process.send_signal(signal.SIGTERM)
    assert run.end() == 143, run.stderr
    saved = run.of_type("checkpoint")[-1]
    step = saved["step"]
    assert saved["answers_request"] is False and Path(saved["path"]).is_file()
    # Every rank logged its last step and left at the one it agreed on: none waits in a
    # collective, none is left running.
    assert run.steps(0)[-1] == run.steps(1)[-1] == step
    messages = [e["message"] for e in run.of_type("log")]
    assert f"Stopped: 2 rank(s) left at step {step}." in messages
    assert not run.of_type("finished") and not run.of_type("failed")
    assert not [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    again = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py",
                     "--resume", saved["path"], args=["--steps", str(step + 2)])  # fmt: skip
    assert again.end() == 0, again.stderr
    assert again.steps(0) == again.steps(1) == [step + 1, step + 2]
    assert f"resumed from {saved['path']} at step {step}" in again.stderr


def test_a_script_without_the_library_is_ended_at_once_and_a_failure_says_why(
    tmp_path: Path,
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "idle.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    (code / "broken.py").write_text("raise ValueError('no data in ./missing')\n")
    idle = Launched(tmp_path, "--nproc", "1", "--entrypoint", "idle.py", code=code, args=[])
    deadline = time.monotonic() + WAIT_SECONDS
    while "rank 0 STDOUT | up" not in idle.stderr and time.monotonic() < deadline:
        time.sleep(0.2)
    began = time.monotonic()
    idle.process.send_signal(signal.SIGTERM)
    assert idle.end() == 143
    assert time.monotonic() - began < 30  # not the 60 s a library's ranks would get
    assert any("no rank of this script asks" in e["message"] for e in idle.of_type("log"))

    broken = Launched(tmp_path, "--nproc", "1", "--entrypoint", "broken.py", code=code, args=[])
    assert broken.end() == 1
    failed = broken.of_type("failed")[0]
    assert failed["error"] == (
        "your script exited with code 1 (rank 0: ValueError: no data in ./missing)"
    )
    assert "ValueError: no data in ./missing" in failed["traceback"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--strategy", "script", "--code-dir", str(PLAIN_DDP)], "needs --entrypoint"),
        (["--strategy", "script", "--entrypoint", "train.py"], "needs --code-dir"),
        (
            ["--strategy", "script", "--code-dir", str(PLAIN_DDP), "--entrypoint", "nope.py"],
            "no file nope.py",
        ),
        (
            ["--strategy", "script", "--code-dir", str(PLAIN_DDP), "--entrypoint", "../x.py"],
            "must be a path inside --code-dir",
        ),
        (["--strategy", "ddp", "--entrypoint", "train.py"], "only with --strategy script"),
        (["--strategy", "single", "--", "--lr", "1"], "only with --strategy script"),
    ],
)
def test_the_command_line_refuses_a_script_it_cannot_run(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        parse_args(argv)
    assert ended.value.code == 2
    assert says in capsys.readouterr().err


def test_outside_a_launch_the_library_is_quiet_and_checks_what_it_is_given() -> None:
    run = Run(env={})
    assert run.id is None and run.resume_path is None and run.checkpoint_dir is None
    run.log({"loss": 0.5}, step=1)
    assert run.should_stop() is False and run.checkpoint_requested() is False
    with pytest.raises(TypeError, match="must be a number"):
        run.log({"loss": "low"}, step=2)
    with pytest.raises(TypeError, match="step must be"):
        run.log({"loss": 0.1}, step=True)  # type: ignore[arg-type]
    run.finish()


def test_the_ranks_agree_about_every_quarter_second_at_calls_they_agreed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(agree.time, "monotonic", lambda: clock[0])
    pace = agree.Pace(fixed=None, seconds=0.25)
    assert pace.tick() and pace.proposal() == 1  # no pace known: the next call agrees too
    pace.agreed(1)
    assert pace.tick() and pace.proposal() == 2  # a call no time after: twice as many, no more
    pace.agreed(2)
    clock[0] += 0.04
    assert not pace.tick() and pace.tick() and pace.proposal() == 4  # the pace not yet reached
    pace.agreed(4)
    clock[0] += 0.08  # 20 ms a call, measured over 4: 12 calls fill 0.25 s
    assert [pace.tick() for _ in range(4)] == [False] * 3 + [True] and pace.proposal() == 8
    pace.agreed(8)
    clock[0] += 0.16
    assert [pace.tick() for _ in range(8)][-1] and pace.proposal() == 12
    pace.agreed(12)
    assert [pace.tick() for _ in range(12)] == [False] * 11 + [True]
    clock[0] += 24.0  # 2 s a call: every call agrees
    assert pace.proposal() == 1
    assert agree.Pace(fixed=3, seconds=0.25).proposal() == 3  # TRAINYARD_AGREE_EVERY


def test_before_its_process_group_a_rank_takes_no_pace_of_its_own() -> None:
    """Calls made alone (before init_process_group) fix no pace: each rank would fix its own,
    and the first call in the group would be due on one rank and not the other."""
    run = Run(env={})
    for _ in range(5):
        run.should_stop()
        run.checkpoint_requested()
    assert run.pace.due == run.pace.calls + 1


def test_in_a_launch_the_library_writes_its_rank_s_events(tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"stop": False, "checkpoint": 1}))
    env = {"TRAINYARD_EVENTS_DIR": str(tmp_path), "TRAINYARD_CONTROL": str(control),
           "TRAINYARD_RUN_ID": "12", "RANK": "1", "WORLD_SIZE": "1"}  # fmt: skip
    run = Run(env=env)
    assert run.id == 12
    run.log({"loss": float("nan"), "n": 3})
    assert run.checkpoint_requested() is True
    run.checkpoint_saved(tmp_path / "c.pt", step=1)
    assert run.checkpoint_requested() is False  # answered
    control.write_text(json.dumps({"stop": True, "checkpoint": 1}))
    assert run.should_stop() is True
    run.finish()
    lines = [json.loads(x) for x in (tmp_path / "rank-1.jsonl").read_text().splitlines()]
    assert [e["type"] for e in lines] == ["hello", "metrics", "listening", "stopping", "done"]
    assert lines[1]["values"] == {"loss": None, "n": 3.0} and lines[1]["step"] == 1
    assert [e["seq"] for e in lines] == [1, 2, 3, 4, 5] and {e["rank"] for e in lines} == {1}
