"""Every pytest process (and every xdist worker) has a TRAINYARD_HOME and a test database of its
own (tests/conftest.py), so two runs in one checkout never share a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.django_db
def test_the_home_and_the_test_database_are_this_process_own(
    tmp_path_factory: pytest.TempPathFactory, settings: Any
) -> None:
    from django.db import connection

    home = Path(os.environ["TRAINYARD_HOME"])
    assert home.is_relative_to(tmp_path_factory.getbasetemp())  # one per process and worker
    assert Path(settings.VAR_DIR) == home
    for name in ("TRAINYARD_DATA_DIR", "TRAINYARD_RUNS_DIR"):
        if name not in os.environ:
            assert Path(getattr(settings, name)).parent == home, name
    if connection.vendor == "sqlite":
        assert Path(connection.settings_dict["NAME"]) == home / "test.sqlite3"


def test_a_second_process_waits_for_the_subnet_lock() -> None:
    """Two test processes starting a network at once choose their /24 one after the other."""
    from tests import netns

    take = (
        "import fcntl, sys; lock = open(sys.argv[1], 'a')\n"
        "try: fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except BlockingIOError: sys.exit(3)"
    )
    command = [sys.executable, "-c", take, netns.SUBNET_LOCK]
    with netns.subnet_lock():
        assert subprocess.run(command, check=False, timeout=60).returncode == 3
    assert subprocess.run(command, check=False, timeout=60).returncode == 0
