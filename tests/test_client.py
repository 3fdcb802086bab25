"""The `trainyard` command: its config and parsing here, then end to end against the real stack
(login, launch --watch to the end with a progress bar, stop, logs, metrics CSV, exit codes)."""

from __future__ import annotations

import csv
import io
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.factories import value_off_default
from tests.stack import ROOT, Stack, wait_for
from training.registry import CHOICE, OPTIONS_DECLARED, SWITCH, StrategyOption
from trainyard import cli, commands
from trainyard import watch as watch_module
from trainyard.api import ApiError
from trainyard.commands import gpus_parse, run_ended
from trainyard.config import ConfigError, Profile, config_save, profile_resolve
from trainyard.watch import (
    MAX_RECONNECTS,
    Resync,
    Watch,
    message_take,
    run_follow,
    snapshot_take,
)

TRAINYARD = Path(sys.executable).parent / "trainyard"


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_config_is_private_and_flags_beat_env_beat_file(
    config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config_save(url="http://saved:1", token="ty_saved")
    assert path == config_home / "trainyard" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert profile_resolve(url=None, token=None).url == "http://saved:1"
    monkeypatch.setenv("TRAINYARD_URL", "http://env:2/")
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_env")
    assert profile_resolve(url=None, token=None) == profile_resolve(url="http://env:2", token=None)
    assert profile_resolve(url=None, token=None).token == "ty_env"
    assert profile_resolve(url="http://flag:3", token="ty_flag").url == "http://flag:3"
    path.unlink()
    monkeypatch.delenv("TRAINYARD_TOKEN")
    with pytest.raises(ConfigError, match="no token"):
        profile_resolve(url=None, token=None)


def test_the_saved_token_goes_to_the_saved_server_only(
    config_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config_save(url="https://trainyard.example", token="ty_saved")
    assert profile_resolve(url="https://trainyard.example/", token=None).token == "ty_saved"
    for url in ("https://evil.example", "http://trainyard.example"):
        with pytest.raises(ConfigError, match="give --token or TRAINYARD_TOKEN"):
            profile_resolve(url=url, token=None)
    monkeypatch.setenv("TRAINYARD_URL", "https://other.example")
    assert cli.main(["list"]) == 2
    assert "saved token is for https://trainyard.example" in capsys.readouterr().err
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_other")
    assert profile_resolve(url=None, token=None) == Profile("https://other.example", "ty_other")


def test_login_reads_the_token_from_stdin(
    config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = []

    class FakeApi:
        def __init__(self, *, url: str, token: str) -> None:
            checked.append((url, token))

        def experiments(self) -> list[Any]:
            return []

    monkeypatch.setattr(commands, "Api", FakeApi)
    monkeypatch.setattr(sys, "stdin", io.StringIO("ty_piped\n"))
    assert cli.main(["login", "https://trainyard.example", "--token-stdin"]) == 0
    assert checked == [("https://trainyard.example", "ty_piped")]
    assert profile_resolve(url=None, token=None).token == "ty_piped"


class FakeRunApi:
    def experiment(self, pk: int) -> dict[str, Any]:
        return {"id": pk, "status": "succeeded"}


def test_watch_gives_up_only_on_failures_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run's socket breaks now and then after working a while: that never adds up to
    giving up; connections that never get a snapshot do, after MAX_RECONNECTS."""
    sessions = []
    monkeypatch.setattr(watch_module.time, "sleep", lambda seconds: None)

    def working_then_broken(api: Any, watch: Watch, **kwargs: Any) -> bool:
        sessions.append(1)
        if len(sessions) > 3 * MAX_RECONNECTS:
            return True
        snapshot_take(watch, {"seq": 0, "experiment": {"status": "running"}})
        raise OSError("connection reset")

    monkeypatch.setattr(watch_module, "_session", working_then_broken)
    api: Any = FakeRunApi()
    assert run_follow(api, 3, stream=io.StringIO())["status"] == "succeeded"
    assert len(sessions) == 3 * MAX_RECONNECTS + 1

    def refused(api: Any, watch: Watch, **kwargs: Any) -> bool:
        raise OSError("connection refused")

    monkeypatch.setattr(watch_module, "_session", refused)
    with pytest.raises(ApiError, match="lost the connection"):
        run_follow(api, 3, stream=io.StringIO())


def test_without_a_server_it_says_how_to_log_in(
    config_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["list"]) == 2
    assert "trainyard login URL" in capsys.readouterr().err


def test_gpu_ids_and_watch_sequence() -> None:
    assert gpus_parse("0, 1") == [0, 1] and gpus_parse("") == [] and gpus_parse("x") == ["x"]
    watch = Watch(pk=1, stream=io.StringIO(), seq=5)
    message_take(watch, {"type": "status", "status": "running", "seq": 4})  # old: dropped
    message_take(watch, {"type": "status", "status": "running", "seq": 6})
    assert watch.seq == 6 and watch.status == "running"
    with pytest.raises(Resync):
        message_take(watch, {"type": "step", "seq": 9, "step": 3})


def test_the_option_flags_are_the_engines() -> None:
    """The client cannot import training/registry.py: its copy of the flags must agree."""
    flags = {flag: (kind, text) for flag, kind, text in commands.OPTION_FLAGS}
    assert list(flags) == [option.flag for option in OPTIONS_DECLARED]
    for option in OPTIONS_DECLARED:
        kind, text = flags[option.flag]
        assert commands.option_field(option.flag) == option.name
        assert kind is (None if option.kind == SWITCH else type(option.default))
        if option.kind == CHOICE:
            assert all(str(value) in text for value in option.values), option.flag


def launches_recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The fields of each launch the client sends, answered as the server would."""
    sent: list[dict[str, Any]] = []

    class Recorder:
        def launch(self, fields: dict[str, Any]) -> dict[str, Any]:
            sent.append(fields)
            return {"id": 7, "url": "/experiments/7/"}

    monkeypatch.setattr(commands, "api_of", lambda args: Recorder())
    return sent


@pytest.mark.parametrize("option", OPTIONS_DECLARED, ids=lambda option: option.name)
def test_launch_sends_each_option_flag(
    option: StrategyOption, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sent = launches_recorded(monkeypatch)
    value = value_off_default(option)
    assert cli.main(["launch", "--strategy", "ddp", *option.cli_args(value)]) == 0
    assert sent == [{"strategy": "ddp", option.name: value}]
    assert capsys.readouterr().out == "7\n"
    # Not given: not sent, so that the server's default (or a strategy's refusal) holds.
    assert cli.main(["launch", "--strategy", "ddp"]) == 0
    assert sent[-1] == {"strategy": "ddp"}


def test_launch_sends_a_language_models_and_a_slurm_jobs_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 36's and 37's launch fields, from `trainyard launch` as from the form."""
    sent = launches_recorded(monkeypatch)
    args = ["--model", "byte-llama", "--dataset", "jargon", "--model-size", "smoke"]
    args += ["--seq-len", "64", "--no-sequence-parallel", "--backend", "slurm"]
    args += ["--partition", "debug", "--time-limit-minutes", "30"]
    assert cli.main(["launch", *args]) == 0
    assert sent == [
        {"model": "byte-llama", "dataset": "jargon", "model_size": "smoke", "seq_len": 64,
         "sequence_parallel": False, "backend": "slurm", "partition": "debug",
         "time_limit_minutes": 30}
    ]  # fmt: skip
    assert cli.main(["launch", "--sequence-parallel"]) == 0
    assert sent[-1] == {"sequence_parallel": True}


@pytest.mark.parametrize(("status", "code"), [("succeeded", 0), ("failed", 1), ("cancelled", 3)])
def test_exit_codes_follow_how_the_run_ended(
    status: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    run = {"id": 7, "status": status, "test_accuracy": 0.5, "error": "why it ended"}
    assert run_ended(run) == code
    out, err = capsys.readouterr()
    if code == 0:
        assert "run #7 succeeded, test accuracy 50.00%" in out and err == ""
    else:
        assert f"run #7 {status}" in err and "why it ended" in err and out == ""


# --- end to end, against Redis, daphne and a Celery worker --------------------------------------


def trainyard(
    stack: Stack, *args: str, home: Path, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [str(TRAINYARD), *args],
        cwd=ROOT,
        env={**os.environ, "XDG_CONFIG_HOME": str(home), **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.integration
@pytest.mark.timeout(400)
# sqlite_only: the client reads the API; the logs and metric buckets it is given are stored and
# queried on both engines by tests/test_logs.py and tests/test_series.py.
@pytest.mark.sqlite_only
def test_login_launch_watch_logs_and_metrics(stack: Stack, tmp_path: Path) -> None:
    login = trainyard(
        stack,
        "login",
        stack.base_url,
        "--username",
        "alice",
        "--password-stdin",
        home=tmp_path,
        stdin=stack.passwords["alice"] + "\n",
    )
    assert login.returncode == 0, login.stderr
    config = tmp_path / "trainyard" / "config.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600

    run = trainyard(
        stack, "launch", "--strategy", "ddp", "--nproc", "2", "--epochs", "1", "--watch",
        home=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + stack.diagnostics()
    # tqdm's bar, with the epoch, the loss and the accuracy after the epoch's evaluation.
    assert "100%|" in run.stderr and "epoch 1/1" in run.stderr, run.stderr
    assert "loss=" in run.stderr and "acc=" in run.stderr, run.stderr
    assert "succeeded, test accuracy" in run.stdout
    pk = int(run.stderr.split("run #", 1)[1].split(" ", 1)[0])

    listed = trainyard(stack, "list", home=tmp_path)
    assert listed.returncode == 0 and f"{pk:>6}  succeeded" in listed.stdout, listed.stdout
    metrics = trainyard(stack, "metrics", str(pk), "--format", "csv", home=tmp_path)
    rows = list(csv.DictReader(io.StringIO(metrics.stdout)))
    assert metrics.returncode == 0 and rows, metrics.stderr
    assert {"step", "epoch", "train_loss", "test_accuracy"} <= set(rows[0])
    assert any(row["test_accuracy"] for row in rows) and float(rows[-1]["step"]) > 0
    logs = trainyard(stack, "logs", str(pk), "--rank", "0", "--follow", home=tmp_path)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    again = trainyard(stack, "watch", str(pk), home=tmp_path)
    assert again.returncode == 0 and "succeeded" in again.stdout


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_stopped_run_exits_non_zero_and_bad_input_says_why(stack: Stack, tmp_path: Path) -> None:
    key = stack.manage("create_token", "alice").strip()
    flags = ["--url", stack.base_url, "--token", key]
    launched = trainyard(
        stack, *flags, "launch", "--strategy", "ddp", "--epochs", "20", home=tmp_path
    )
    assert launched.returncode == 0, launched.stderr
    pk = int(launched.stdout)
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    env.update(TRAINYARD_URL=stack.base_url, TRAINYARD_TOKEN=key)
    watcher = subprocess.Popen(  # noqa: S603
        [str(TRAINYARD), "watch", str(pk)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(
            lambda: stack.experiment_row(pk)["status"] == "running",
            timeout=120,
            what="the run to start",
        )
        time.sleep(1)
        stopped = trainyard(stack, "stop", str(pk), home=tmp_path, env=env)
        assert stopped.returncode == 0, stopped.stderr
        _, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 3, err
    assert f"run #{pk} cancelled" in err and "alice" in err

    bad = trainyard(stack, "launch", "--epochs", "0", "--nproc", "2", home=tmp_path, env=env)
    assert bad.returncode == 2
    assert "invalid experiment" in bad.stderr
    assert "epochs: Ensure this value is greater than or equal to 1." in bad.stderr
    wrong = trainyard(stack, "list", home=tmp_path, env={**env, "TRAINYARD_TOKEN": "ty_nope"})
    assert wrong.returncode == 5 and "invalid or revoked API token" in wrong.stderr


def test_the_installed_command_imports_neither_django_nor_the_server() -> None:
    """`trainyard --help`, the console script pip installed, on a machine that only wants the
    client: no Django, no dashboard/ (its __init__ starts the Celery app), no torch. Python's
    -X importtime (PYTHONPROFILEIMPORTTIME) lists every module the process imported."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    result = subprocess.run(  # noqa: S603
        [str(TRAINYARD), "--help"], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    assert "launch" in result.stdout and "watch" in result.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    assert "trainyard.cli" in imported
    for server in ("django", "dashboard", "celery", "channels", "training", "torch"):
        assert server not in imported or server == "training", server
        # Of the engine, the plain-Python homes of the wire and of how a repository is read
        # (`trainyard run` packs one), and the packages above them.
        shared = {"training.protocol", "training.protocol_entries", "training.scripts",
                  "training.scripts.provenance"}  # fmt: skip
        found = {name for name in imported if name.startswith(server + ".")}
        assert not found - shared, (server, found - shared)
