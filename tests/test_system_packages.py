"""`make test` on a machine that lacks a package it needs: install it, or stop with the command.

The script runs as an unprivileged user (no sudo) with a PATH that lacks Chromium, as on a fresh
machine where only root may install: it must stop at once and print the one command to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need
from tests.postgres import postgres_bin

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "system-packages"
# What the script itself runs, besides the tools it looks for.
BASICS = ("bash", "env", "id", "df", "awk")
# Where Debian installs them (root's own folders, such as pyenv's shims, are closed to nobody).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder the unprivileged user can enter (pytest's own sits in a 0700 folder of root's)."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-packages-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _bin_with(tmp_path: Path, tools: list[str]) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in [*BASICS, *tools]:
        found = shutil.which(tool, path=SYSTEM_PATH)
        assert found, f"{tool} is not in {SYSTEM_PATH}"
        (folder / tool).symlink_to(found)
    return folder


def _run_unprivileged(tmp_path: Path, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root to run the script as the unprivileged user nobody")
    # A copy the user can read: the checkout may sit in a folder closed to others (mktemp -d's
    # 0700, as a CI clone may be).
    script = tmp_path / "system-packages"
    shutil.copyfile(SCRIPT, script)
    script.chmod(0o755)
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", str(path / "env"), "-i", f"PATH={path}",
         f"TMPDIR={tmp_path}", *(f"{k}={v}" for k, v in env.items()),
         str(path / "bash"), str(script), "test"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_without_chromium_it_stops_with_the_command(tmp_path: Path) -> None:
    need(shutil.which("chromium", path=SYSTEM_PATH) is not None, "no Chromium")
    path = _bin_with(tmp_path, ["python3.11", "redis-server"])
    done = _run_unprivileged(tmp_path, path, TRAINYARD_TEST_FREE_GB="0")
    assert done.returncode == 1, done.stderr
    assert "sudo sh -c 'apt-get update && apt-get install -y chromium'" in done.stderr
    assert "cannot install" in done.stderr


def test_every_missing_package_is_named_in_one_command(tmp_path: Path) -> None:
    path = _bin_with(tmp_path, ["python3.11"])
    done = _run_unprivileged(
        tmp_path, path, TRAINYARD_TEST_FREE_GB="0", TRAINYARD_FASHION_DIR=str(tmp_path / "none"),
        TRAINYARD_POSTGRES_LIB=str(tmp_path / "none"),
        TRAINYARD_SLURM_PREFIX=str(tmp_path / "none"),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        "apt-get install -y redis-server chromium postgresql dataset-fashion-mnist slurmctld "
        "slurmd slurm-client munge'" in done.stderr
    )


def test_without_postgresql_it_stops_with_the_command(tmp_path: Path) -> None:
    need(shutil.which("chromium", path=SYSTEM_PATH) is not None, "no Chromium")
    need(shutil.which("redis-server", path=SYSTEM_PATH) is not None, "no redis-server")
    path = _bin_with(tmp_path, ["python3.11", "redis-server", "chromium"])
    fashion = tmp_path / "fashion"
    fashion.mkdir()
    done = _run_unprivileged(
        tmp_path, path, TRAINYARD_TEST_FREE_GB="0", TRAINYARD_FASHION_DIR=str(fashion),
        TRAINYARD_POSTGRES_LIB=str(tmp_path / "none"),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "sudo sh -c 'apt-get update && apt-get install -y postgresql'" in done.stderr


def test_with_everything_there_it_passes_quietly(tmp_path: Path) -> None:
    need(shutil.which("chromium", path=SYSTEM_PATH) is not None, "no Chromium")
    need(shutil.which("redis-server", path=SYSTEM_PATH) is not None, "no redis-server")
    need(postgres_bin() is not None, "no PostgreSQL server (package postgresql)")
    path = _bin_with(tmp_path, ["python3.11", "redis-server", "chromium"])
    fashion = tmp_path / "fashion"
    fashion.mkdir()
    done = _run_unprivileged(
        tmp_path, path, TRAINYARD_TEST_FREE_GB="0", TRAINYARD_FASHION_DIR=str(fashion)
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_too_little_disk_stops_with_the_reason(tmp_path: Path) -> None:
    path = _bin_with(tmp_path, ["python3.11"])
    done = _run_unprivileged(tmp_path, path, TRAINYARD_TEST_FREE_GB="999999")
    assert done.returncode == 1
    assert "make test needs 999999 GB free" in done.stderr


def test_a_missing_tool_fails_under_make_test_instead_of_skipping(tmp_path: Path) -> None:
    (tmp_path / "test_needs.py").write_text(
        "from tests.conftest import need\n\ndef test_browser():\n    need(False, 'no Chromium')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TRAINYARD_TESTS_NEED_ALL")}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
            "-c", str(ROOT / "pyproject.toml"), str(tmp_path / "test_needs.py")]  # fmt: skip
    by_hand = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert by_hand.returncode == 0 and "1 skipped" in by_hand.stdout, by_hand.stdout
    strict = subprocess.run(
        args, cwd=ROOT, env={**env, "TRAINYARD_TESTS_NEED_ALL": "1"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert strict.returncode == 1 and "1 failed" in strict.stdout, strict.stdout
    assert "make test installs it" in strict.stdout
