"""Trainyard installed like its peers (issue 38): the built wheel in a fresh virtual environment,
then `trainyard server`, `trainyard worker` and `trainyard launch --watch` from it, as a user of
the wheel runs them, with nothing of the clone on their path.

The one test here builds the wheel and installs it into a new environment, which it deletes
when it ends; torch and torchvision are lent from this one (torch_lend) rather than copied. It
prints the time from the fresh environment to a served dashboard."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
import pytest
import requests

from dashboard import paths
from dashboard.server import LOGS_QUIET, LOGS_VERBOSE, ProcfileError, procfile_commands
from dashboard.serving import PROCFILE, free_port, wait_for
from tests.stack import ROOT
from tests.test_run_terminal import honcho_environment
from trainyard import cli

# What `pip wheel .` reads from the clone, copied so that the build's build/ folder and
# egg-info are never the checkout's (a stale build/lib would put deleted modules in the wheel).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "Procfile",
                "templates", "static", "dashboard", "training", "trainyard")  # fmt: skip
# The test process's own settings, which the wheel's processes must not inherit.
CLONE_ONLY = ("TRAINYARD_", "DJANGO_", "CELERY_", "REDIS_URL", "DATABASE_URL", "LOG_LEVEL",
              "PYTHONPATH", "VIRTUAL_ENV")  # fmt: skip
WORKER = "wheel-worker"


def wheel_build(into: Path) -> Path:
    source = into / "source"
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(path, source / name)
    dist = into / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), "."]
    subprocess.run(command, cwd=source, check=True, timeout=300)  # noqa: S603
    (wheel,) = dist.glob("trainyard-*.whl")
    return wheel


@contextmanager
def started(command: list[str], *, env: dict[str, str], log: Path) -> Iterator[psutil.Popen]:
    """A process of the wheel's in a session of its own, as a terminal would start it; SIGTERM
    on the way out (the test's own stop comes first), SIGKILL to its session if it lingers."""
    with log.open("wb") as out:
        process = psutil.Popen(command, env=env, cwd=log.parent, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except psutil.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def processes_of(venv: Path) -> list[psutil.Process]:
    """Every process on this machine that runs the environment's interpreter or a command of
    its (honcho's shells name it in their command lines)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(venv) in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def answered(url: str, **kwargs: object) -> requests.Response | None:
    try:
        return requests.get(url, timeout=5, **kwargs)  # type: ignore[arg-type]
    except requests.RequestException:
        return None


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def client(trainyard: str, *args: str, env: dict[str, str], **kwargs: object) -> str:
    """A `trainyard` client command that must succeed; its stdout."""
    done = subprocess.run([trainyard, *args], env=env, capture_output=True, text=True,  # noqa: S603
                          timeout=400, check=False, **kwargs)  # type: ignore[call-overload]  # fmt: skip
    assert done.returncode == 0, f"{args[0]}: {done.returncode}\n{done.stdout}{done.stderr}"
    return str(done.stdout)


def test_the_wheel_runs_the_procfiles_processes(tmp_path: Path) -> None:
    """`trainyard server` runs what `make run` runs: every Procfile line, with this
    environment's interpreter for .venv/bin and TRAINYARD_HOME for var/; a line naming another
    file of the clone is refused rather than started wrong."""
    home = tmp_path / "my home"
    commands = procfile_commands(python="/opt/ty/bin/python", home=home)
    names = re.findall(r"^([\w-]+):", PROCFILE.read_text(), flags=re.MULTILINE)
    assert list(commands) == names
    assert all(".venv" not in line and "manage.py" not in line for line in commands.values())
    assert "/opt/ty/bin/python -P -m daphne" in commands["web"]
    assert f"'{home}'/celerybeat-schedule" in commands["beat"]
    odd = tmp_path / "Procfile"
    odd.write_text(PROCFILE.read_text() + "docs: .venv/bin/mkdocs serve\n")
    with pytest.raises(ProcfileError, match="docs"):
        procfile_commands(python="python", home=home, procfile=odd)


def test_the_wheel_says_as_much_as_make_run() -> None:
    """`trainyard server [--verbose]` gives the Procfile what `make run [VERBOSE=1]` gives it."""
    for wheel, make in ((LOGS_QUIET, honcho_environment()),
                        (LOGS_VERBOSE, honcho_environment("VERBOSE=1"))):  # fmt: skip
        assert wheel == {name: make[name] for name in wheel}


def test_the_wheels_data_goes_to_the_users_data_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/srv/xdg")
    assert paths.user_data_dir() == Path("/srv/xdg/trainyard")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # as the XDG spec says
    assert paths.user_data_dir() == Path.home() / ".local" / "share" / "trainyard"
    # This clone is no wheel: make run keeps var/.
    assert not paths.INSTALLED and paths.home_default() == ROOT / "var"


def test_server_and_worker_parse() -> None:
    server = cli.parser_build().parse_args(["server", "--port", "9001"])
    assert (server.port, server.verbose) == (9001, False)
    worker = cli.parser_build().parse_args(["worker", "--redis-url", "redis://h:1/0"])
    assert (worker.redis_url, worker.name) == ("redis://h:1/0", None)


# torch and torchvision, and what they require, lent to the fresh environment from this one: pip
# copying torch's 6 GB of CUDA libraries into it took 4-8 minutes of CI's two cores, and says
# nothing of Trainyard's packaging. Everything else the wheel needs, pip installs.
LENT = ("torch", "torchvision")


def _lent_closure() -> set[str]:
    """LENT's distributions and, transitively, those they require here."""
    from importlib import metadata

    found: set[str] = set()
    todo = list(LENT)
    while todo:
        name = re.split(r"[ ;<>=!~\[]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an extra's, or another platform's
        found.add(name)
        todo.extend(r for r in dist.requires or () if "extra ==" not in r)
    return found


def torch_lend(venv: Path, folder: Path) -> None:
    """Link LENT's closure's files into `folder` and put it on the venv's path (a .pth file):
    pip then finds them installed."""
    from importlib import metadata

    folder.mkdir()
    for name in _lent_closure():
        dist = metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (folder / top).exists() and top != "..":
                (folder / top).symlink_to(source)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "trainyard-lent-torch.pth").write_text(f"{folder}\n")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_wheel_serves_trains_and_stops(tmp_path: Path, data_dir: Path) -> None:
    marks = {"start": time.monotonic()}
    wheel = wheel_build(tmp_path)
    marks["built"] = time.monotonic()
    # The environment goes as soon as the test ends, whatever pytest keeps of tmp_path.
    with ExitStack() as stack:
        venv = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trainyard-wheel-")))
        stack.callback(lambda: [p.kill() for p in processes_of(venv)])  # after a failure only
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)  # noqa: S603
        torch_lend(venv, tmp_path / "lent")
        # --no-compile: pip byte-compiles every file it installs one at a time (django's and
        # the rest), most of which no process here imports; those that are, compile on import.
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
               str(wheel)]  # fmt: skip
        subprocess.run(pip, check=True, timeout=900)  # noqa: S603
        marks["installed"] = time.monotonic()

        trainyard = str(venv / "bin" / "trainyard")
        port, logs = free_port(), tmp_path / "logs"
        url = f"http://127.0.0.1:{port}"
        env = {key: value for key, value in os.environ.items() if not key.startswith(CLONE_ONLY)}
        env |= {
            "XDG_DATA_HOME": str(tmp_path / "data-home"),  # where TRAINYARD_HOME defaults to
            "XDG_CONFIG_HOME": str(tmp_path / "config"),  # where `trainyard login` saves
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "TRAINYARD_DATA_DIR": str(data_dir),  # the test digits: a short epoch
            "PYTHONUNBUFFERED": "1",
        }
        logs.mkdir()
        server = stack.enter_context(
            started([trainyard, "server", "--port", str(port)], env=env, log=logs / "server.log")
        )
        login_page = wait_for(
            lambda: (r := answered(f"{url}/accounts/login/")) is not None and r.ok and r,
            timeout=180, what="the login page",
        )  # fmt: skip
        marks["served"] = time.monotonic()
        # The templates and the static files (the vendored chart library too) come from the wheel.
        assert 'name="password"' in login_page.text, log_tail(logs / "server.log")
        for path in ("/static/css/app.css", "/static/vendor/uplot/uPlot.iife.min.js"):
            assert requests.get(url + path, timeout=5).status_code == 200, path

        # The admin's password, printed once, logs the client in; the schema wants its token.
        password = re.search(r"password: (\S+)", (logs / "server.log").read_text())
        assert password is not None, log_tail(logs / "server.log")
        client(trainyard, "login", url, "--username", "admin", "--password-stdin", env=env,
               input=password.group(1) + "\n")  # fmt: skip
        token = json.loads((tmp_path / "config" / "trainyard" / "config.json").read_text())
        auth = {"Authorization": f"Bearer {token['token']}"}
        schema = requests.get(f"{url}/api/schema/", headers=auth, timeout=10)
        assert schema.status_code == 200 and schema.json()["openapi"].startswith("3.")

        # The worker gets the broker by its flag alone.
        worker_env = {key: value for key, value in env.items() if key != "REDIS_URL"}
        worker_command = [trainyard, "worker", "--redis-url", env["REDIS_URL"], "--name", WORKER]
        worker = stack.enter_context(
            started(worker_command, env=worker_env, log=logs / "worker.log")
        )

        def machines() -> set[str]:
            found = answered(f"{url}/api/devices/", headers=auth)
            return {m["hostname"] for m in found.json()["machines"]} if found else set()

        try:
            wait_for(lambda: WORKER in machines(), timeout=120, interval=1, what=WORKER)
        except TimeoutError:
            pytest.fail(f"{WORKER} never reported:\n{log_tail(logs / 'worker.log')}")
        marks["worker"] = time.monotonic()

        client(trainyard, "launch", "--strategy", "ddp", "--nproc", "2", "--epochs", "1",
               "--machines", WORKER, "--watch", env=env)  # fmt: skip
        marks["trained"] = time.monotonic()
        (ran,) = json.loads(client(trainyard, "list", "--format", "json", env=env))
        assert (ran["status"], ran["worker"]) == ("succeeded", WORKER)

        # Its data went to the user's data folder, none into site-packages.
        home = tmp_path / "data-home" / "trainyard"
        assert (home / "trainyard.sqlite3").is_file()
        assert any((home / "runs").iterdir())
        site = next((venv / "lib").glob("python3*/site-packages"))
        assert not (site / "var").exists() and not (site / "staticfiles").exists()

        for process in (worker, server):
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        wait_for(lambda: not processes_of(venv), timeout=15, what="every process to end")
        marks["stopped"] = time.monotonic()
    phases = list(marks.items())
    took = [f"{name} {at - before:.0f} s" for (_, before), (name, at) in itertools.pairwise(phases)]
    served = marks["served"] - marks["built"]
    print(
        f"\nthe wheel: {', '.join(took)}; a fresh environment to a served dashboard: {served:.0f} s"
    )
