"""Slurm's commands as a test's stand-ins, for the tests of what Trainyard does with their
answers in this process: each is a shell script on PATH that logs its arguments and prints what
the test gave it. The real cluster's answers are tests/test_slurm.py's (tests/slurm_cluster.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class SlurmFake:
    bin: Path
    log: Path

    def command(
        self, name: str, *, out: str = "", status: int = 0, answers: dict[str, str] | None = None
    ) -> None:
        """`name` on PATH: it logs its arguments, prints `out` (or the answer of the first of
        `answers` its arguments begin with: {"show hostnames": "n1\\n"}) and exits with
        `status`."""
        cases = "".join(
            f"  {shlex.quote(start)}*) printf %s {shlex.quote(said)};;\n"
            for start, said in (answers or {}).items()
        )
        script = self.bin / name
        script.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "{name} $*" >> {shlex.quote(str(self.log))}\n'
            f'case "$*" in\n{cases}  *) printf %s {shlex.quote(out)};;\nesac\n'
            f"exit {status}\n"
        )
        script.chmod(0o755)

    def calls(self, name: str = "") -> list[str]:
        """The commands run so far (`name`'s only, where given), each with its arguments."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if not name or line.split(" ", 1)[0] == name]


def slurm_fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmFake:
    """A folder of stand-ins first on PATH (none yet: SlurmFake.command adds them)."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return SlurmFake(bin=bin_dir, log=tmp_path / "slurm-calls.log")


def slurm_backend_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> SlurmFake:
    """The Slurm backend on (the commands here, no login node; runs' files under tmp_path),
    with stand-ins on PATH."""
    settings.TRAINYARD_SLURM = True
    settings.TRAINYARD_SLURM_SSH = ""
    settings.TRAINYARD_RUNS_DIR = tmp_path / "runs"
    return slurm_fake_install(tmp_path, monkeypatch)
