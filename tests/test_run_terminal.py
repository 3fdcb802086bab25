"""`make run`'s terminal (issue 34 item 13): quiet by default, so that the admin's first password
stays in view, instead of beat's and the worker's lines for the lost-run sweep every 10 s and
daphne's for every request; VERBOSE=1 says it all."""

from __future__ import annotations

import shlex
import subprocess
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from dashboard.serving import PROCFILE

ROOT = Path(__file__).resolve().parent.parent


def honcho_environment(*make_args: str) -> dict[str, str]:
    """The variables `make run` starts honcho with (its dry run's last line)."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "run", *make_args],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    words = shlex.split(dry)
    return dict(word.split("=", 1) for word in words[: words.index("-f") - 1] if "=" in word)


def test_make_run_is_quiet_unless_asked_and_the_procfile_takes_it() -> None:
    quiet, verbose = honcho_environment(), honcho_environment("VERBOSE=1")
    assert quiet["CELERY_LOG_LEVEL"] == "WARNING" and quiet["CELERY_QUIET"] == "--quiet"
    assert quiet["SERVICES_VERBOSITY"] == "0" and quiet["LOG_LEVEL"] == "WARNING"
    assert verbose["CELERY_LOG_LEVEL"] == "INFO" and verbose["CELERY_QUIET"] == ""
    assert verbose["SERVICES_VERBOSITY"] == "1"
    lines = dict(
        line.split(":", 1) for line in PROCFILE.read_text().splitlines()
        if line and not line.startswith("#")
    )  # fmt: skip
    for name in ("worker", "beat"):  # celery's banner and its INFO lines (each task's)
        assert "${CELERY_QUIET} " + name in lines[name]
        assert "--loglevel ${CELERY_LOG_LEVEL:-INFO}" in lines[name]
    assert "-v ${SERVICES_VERBOSITY:-1}" in lines["web"]  # daphne's access log
    assert "serve_redis -v ${SERVICES_VERBOSITY:-1}" in lines["redis"]


@pytest.mark.parametrize(("verbosity", "level"), [(0, "warning"), (1, "notice")])
def test_serve_redis_says_less_at_verbosity_0(
    monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path, verbosity: int, level: str
) -> None:
    settings.VAR_DIR = tmp_path
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    started: list[list[str]] = []
    monkeypatch.setattr("os.execv", lambda binary, command: started.append(command))
    out = StringIO()
    call_command("serve_redis", verbosity=verbosity, stdout=out)
    assert started[0][started[0].index("--loglevel") + 1] == level
    assert ("Starting" in out.getvalue()) is (verbosity >= 1)
