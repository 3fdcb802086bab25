"""Running a Slurm command: here, or on a login node over ssh (TRAINYARD_SLURM_SSH).

The web server and beat ask the cluster (sbatch, squeue, scancel, sinfo); a job's supervisor
asks it from inside the allocation (`here=True`: srun's node has the commands, and no ssh).
"""

from __future__ import annotations

import shlex
import subprocess

from django.conf import settings

# A command that hangs (a controller down) must not hold a web request or a beat round long.
COMMAND_SECONDS = 30.0


class SlurmError(Exception):
    """A Slurm command failed, with what it said."""


def slurm_command_line(args: list[str], *, here: bool = False) -> list[str]:
    """The command as run: itself, or through ssh to TRAINYARD_SLURM_SSH (BatchMode: a key, never
    a password prompt)."""
    login = "" if here else settings.TRAINYARD_SLURM_SSH
    if not login:
        return args
    return ["ssh", "-o", "BatchMode=yes", login, "--", shlex.join(args)]


def slurm_run(
    args: list[str], *, stdin: str | None = None, here: bool = False,
    timeout: float = COMMAND_SECONDS,
) -> str:  # fmt: skip
    """Run a Slurm command; its stdout, or SlurmError with its stderr."""
    line = slurm_command_line(args, here=here)
    try:
        done = subprocess.run(  # noqa: S603 - the arguments are ours, never a shell's
            line, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        where = "TRAINYARD_SLURM_SSH's login node" if line[0] == "ssh" else "this machine's PATH"
        raise SlurmError(f"{line[0]} is not on {where}: install slurm-client, or set "
                         "TRAINYARD_SLURM_SSH=user@login-node") from None  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{args[0]} did not answer within {timeout:g} s") from None
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
        raise SlurmError(f"{args[0]}: {said}")
    return done.stdout
