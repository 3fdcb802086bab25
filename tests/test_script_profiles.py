"""Profiles on request for a script with no Trainyard line (issue 33 item 5): asked as the worker
asks (request.json in --profile-dir, then SIGUSR2 to the launcher), recorded by every rank's
observer from the step they agreed on (training/scripts/profiles.py), answered with the engine's
`profile` events; and a profiler that raises, said once while the script goes on. The dashboard's
side, the same as for the engine's runs, is tests/test_profiles.py's (and test_script_stack.py
asks a script run through the stack).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.test_protocol import EVENT_CLASSES, assert_matches
from tests.test_script_observer import code  # noqa: F401 - a fixture: the script's folder
from tests.test_script_runs import Launched
from training.protocol import ProfileRankSummary, ProfileTrace
from training.scripts import profiles
from training.scripts.control import Requests, requests_write
from training.scripts.profiles import PROFILE_FIGURES, ScriptProfiles


def launched(
    tmp_path: Path, request: pytest.FixtureRequest, *, nproc: int, epochs: int, images: int
) -> tuple[Launched, dict[str, Any]]:
    """tests/scripts/observed (no Trainyard line) launched as the worker does, with its
    --profile-dir (tmp_path/profiles), and its `started` event."""
    folder = request.getfixturevalue("code")  # a parameter would shadow the import
    run = Launched(tmp_path, "--nproc", str(nproc), "--entrypoint", "train.py", "--profile-dir",
                   str(tmp_path / "profiles"), code=folder,
                   args=["--epochs", str(epochs), "--images", str(images)])  # fmt: skip
    return run, run.wait_for(lambda e: e["type"] == "started")


def profile_asked(run: Launched, folder: Path, *, profile: int, steps: int) -> None:
    """As the worker's supervisor asks (dashboard/experiments/runs/requests.py)."""
    folder.mkdir(exist_ok=True)
    (folder / "request.json").write_text(json.dumps({"profile": profile, "steps": steps}))
    os.kill(run.process.pid, signal.SIGUSR2)


def test_a_ddp_script_is_profiled_on_both_ranks_from_the_same_step(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_OBSERVE_EVERY", "4")
    folder = tmp_path / "profiles"
    run, started = launched(tmp_path, request, nproc=2, epochs=2, images=2048)
    assert started["profile_dir"] == str(folder) and started["requests_pid"] == run.process.pid
    run.wait_for(lambda e: e["type"] == "step")  # the observer's first window: the ranks met
    profile_asked(run, folder, profile=3, steps=5)
    recording = run.wait_for(lambda e: e["type"] == "profile")
    ready = run.wait_for(lambda e: e["type"] == "profile")
    assert run.end() == 0, run.stderr

    assert (recording["state"], ready["state"]) == ("recording", "ready"), ready
    # Started at the step after a window, which every rank closes at the same step.
    windows = {e["step"] for e in run.of_type("step")}
    assert recording["first_step"] - 1 in windows and ready["first_step"] == recording["first_step"]
    assert (ready["profile"], ready["steps"], ready["recorded_steps"]) == (3, 5, 5)
    for event in (recording, ready):  # the engine's events, as the dashboard stores them
        assert_matches(event, EVENT_CLASSES["profile"], every=False)
    assert [t["rank"] for t in ready["traces"]] == [0, 1]
    for trace, summary in zip(ready["traces"], ready["summary"], strict=True):
        assert_matches(trace, ProfileTrace, every=True)
        assert_matches(summary, ProfileRankSummary, every=True)
        assert trace["path"] == str(folder / "3" / f"rank-{trace['rank']}.json.gz")
        assert os.path.getsize(trace["path"]) == trace["bytes"]
        with gzip.open(trace["path"], "rt") as f:
            names = [e.get("name", "") for e in json.load(f)["traceEvents"]]
        # The profiler's own step marks: exactly the steps asked for, each with DDP's all-reduce.
        assert len({n for n in names if n.startswith("ProfilerStep#")}) == 5
        assert any(n.startswith("c10d::allreduce") for n in names)
        assert summary["device"] == "cpu"
        assert 0 < summary["communication_seconds"] < summary["wall_seconds"]
        assert any(op["name"].startswith("aten::") for op in summary["ops"])
    # Steps and windows go on during and after it.
    assert run.of_type("step")[-1]["step"] > ready["first_step"] + 5


def test_a_script_run_without_its_observer_refuses_a_profile_and_says_why(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_OBSERVE", "0")
    run, started = launched(tmp_path, request, nproc=1, epochs=4, images=512)
    assert started["profile_dir"] is None  # the dashboard refuses a request for it (4xx)
    profile_asked(run, tmp_path / "profiles", profile=1, steps=2)
    refused = run.wait_for(lambda e: e["type"] == "profile")
    assert refused["state"] == "refused" and "TRAINYARD_OBSERVE=0" in refused["message"]
    assert run.end() == 0, run.stderr


# ---- one rank's profiles, driven as the observer drives them ---------------------------------


class Driven:
    """A rank's ScriptProfiles driven as observer.py does, alone (its gather: itself)."""

    def __init__(self, tmp_path: Path):
        self.control = tmp_path / "control.json"
        self.sent: list[dict[str, Any]] = []
        env = {"TRAINYARD_CONTROL": str(self.control),
               "TRAINYARD_PROFILE_DIR": str(tmp_path / "profiles")}  # fmt: skip
        self.profiles = ScriptProfiles(env, rank=0, send=self.send)
        self.step = 0

    def send(self, type_: str, **fields: Any) -> None:
        self.sent.append({"type": type_, **fields})

    def ask(self, profile: int, steps: int) -> None:
        requests_write(path=self.control,
                       requests=Requests(profile=profile, profile_steps=steps))  # fmt: skip

    def steps(self, count: int) -> None:
        """`count` steps, a window closing after each."""
        for _ in range(count):
            self.step += 1
            self.profiles.stepped(gather=lambda value: [value])
            row = [9.0, *self.profiles.row(), 0.0]  # a proposal, PROFILE_FIGURES, failed
            self.profiles.agreed([row], at=1, step=self.step)


def test_a_profiler_that_raises_is_said_once_and_the_script_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(device: Any) -> Any:
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(profiles, "profiler_start", broken)
    rank = Driven(tmp_path)
    rank.ask(1, 2)
    rank.steps(4)
    rank.ask(2, 1)
    rank.steps(3)
    assert [(e["profile"], e["state"]) for e in rank.sent] == [
        (1, "recording"), (1, "refused"), (2, "recording"), (2, "refused"),
    ]  # fmt: skip
    assert rank.sent[1]["message"] == (
        "the profile could not be written: rank 0: the profiler could not start: "
        "RuntimeError: no profiler here"
    )
    said = capsys.readouterr().err.splitlines()
    assert said == ["trainyard's profiler could not start: RuntimeError: no profiler here; no "
                    "trace from this rank, the script goes on"]  # fmt: skip
    assert rank.profiles.request is None and PROFILE_FIGURES == ("profile", "profile_steps")


def test_a_recording_the_script_outlives_not_is_refused_and_each_request_taken_once(
    tmp_path: Path,
) -> None:
    rank = Driven(tmp_path)
    rank.ask(4, 3)
    rank.steps(2)
    assert [e["state"] for e in rank.sent] == ["recording"] and rank.sent[0]["first_step"] == 2
    rank.profiles.abandon("the script ended")
    assert rank.sent[-1]["message"] == "the script ended after 1 of its 3 step(s)"
    rank.steps(3)  # the control file still names request 4: taken already
    assert len(rank.sent) == 2


def test_the_launcher_of_rank_0_passes_its_windows_on_on_any_machine(tmp_path: Path) -> None:
    """torchrun's c10d rendezvous numbers the machines by address, then agent PID: rank 0 may be
    on a machine other than the first (under srun, either node). Its launcher alone reads the
    observer's windows and rank 0's events, and passes them on (else a profile never ends)."""
    import io
    import shutil

    from training.config import parse_args
    from training.protocol import EventWriter
    from training.scripts.launch import ScriptLauncher

    (tmp_path / "train.py").write_text("")
    # The second machine's launcher: no --rdzv-host.
    cfg = parse_args([
        "--run-id", "5", "--strategy", "script", "--entrypoint", "train.py", "--code-dir",
        str(tmp_path), "--nnodes", "2", "--rdzv-endpoint", "h:29400", "--rdzv-id", "r5",
    ])  # fmt: skip
    out = io.StringIO()
    launcher = ScriptLauncher(cfg, EventWriter("5", stream=out))
    try:
        assert not launcher.chief
        said = {"v": 1, "seq": 1, "time": 0.0, "rank": 0}
        (launcher.folder / "observer-0.jsonl").write_text(
            json.dumps({**said, "type": "profile", "profile": 2, "state": "recording", "steps": 3})
            + "\n"
        )  # fmt: skip
        (launcher.folder / "rank-0.jsonl").write_text(
            json.dumps({**said, "type": "checkpoint", "step": 7, "path": "/c/7.pt"}) + "\n"
        )
        launcher.windows_take()
        launcher.events_take()
    finally:
        shutil.rmtree(launcher.folder, ignore_errors=True)
    events = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    assert [(e["type"], e.get("profile"), e.get("step")) for e in events] == [
        ("profile", 2, None), ("checkpoint", None, 7),
    ], out.getvalue()  # fmt: skip
