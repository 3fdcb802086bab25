"""`trainyard server`: the dashboard as `make run` serves it, from an installed wheel.

The `trainyard` command never imports Django, so it starts this module as
`python -P -m dashboard.server --port N` (by exec: Ctrl-C and SIGTERM come straight here). It
does what `make run` does after its set-up: migrate, make the first admin (its password printed
once), then run the Procfile's processes under honcho, which ends them all on Ctrl-C or SIGTERM.
The Procfile stays their one home: its words that only a clone gives meaning to (.venv/bin/...,
manage.py, var/) become this interpreter and TRAINYARD_HOME.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from dashboard.serving import PROCFILE

DEFAULT_PORT = 8000
# A clone's words in the Procfile, and what stands for each in an installed wheel. -P: the folder
# a command starts in is never searched for modules (a user's own `training/` would shadow ours).
CLONE_WORDS = {
    ".venv/bin/python manage.py": "{python} -P -m django",
    ".venv/bin/daphne": "{python} -P -m daphne",
    ".venv/bin/celery": "{python} -P -m celery",
}
VAR_WORD = re.compile(r"(?<![\w./-])var/")
# What make run's RUN_LOGS gives the Procfile: a quiet terminal, or with --verbose the services'
# banners, every task and every request.
LOGS_QUIET = {"SERVICES_VERBOSITY": "0", "CELERY_QUIET": "--quiet",
              "CELERY_LOG_LEVEL": "WARNING", "LOG_LEVEL": "WARNING"}  # fmt: skip
LOGS_VERBOSE = {"SERVICES_VERBOSITY": "1", "CELERY_QUIET": "",
                "CELERY_LOG_LEVEL": "INFO", "LOG_LEVEL": "INFO"}  # fmt: skip


class ProcfileError(ValueError):
    """A Procfile line names something an installed wheel does not have."""


def procfile_commands(*, python: str, home: Path, procfile: Path = PROCFILE) -> dict[str, str]:
    """The Procfile's processes (name: shell command line) for this interpreter and home."""
    from honcho.environ import parse_procfile

    commands = {}
    for name, line in parse_procfile(procfile.read_text()).processes.items():
        command = line
        for word, wheel in CLONE_WORDS.items():
            command = command.replace(word, wheel.format(python=shlex.quote(python)))
        command = VAR_WORD.sub(lambda _: shlex.quote(str(home)) + "/", command)
        left = [word for word in (".venv/", "manage.py") if word in command]
        if left or VAR_WORD.search(command):
            raise ProcfileError(f"{procfile}'s {name!r} names {left or 'var/'}: {line}")
        commands[name] = command
    return commands


def parser_build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainyard server", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--verbose", action="store_true")
    return parser


def database_ready() -> Path:
    """Migrate and make the first admin, as `make run` does before it starts the services;
    returns TRAINYARD_HOME."""
    import django
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    call_command("ensure_admin")
    # honcho forks a process per service: none may share this one's database connection.
    connections.close_all()
    return Path(settings.VAR_DIR)


def main(argv: Sequence[str] | None = None) -> int:
    from honcho.manager import Manager
    from honcho.printer import Printer

    args = parser_build().parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ.update(LOGS_VERBOSE if args.verbose else LOGS_QUIET, WEB_PORT=str(args.port))
    home = database_ready()
    os.environ["TRAINYARD_HOME"] = str(home)  # every service finds the same folder
    commands = procfile_commands(python=sys.executable, home=home)
    print(f"Trainyard: http://127.0.0.1:{args.port}/  (Ctrl-C stops everything; data in {home})",
          flush=True)  # fmt: skip
    manager = Manager(Printer(sys.stdout, colour=sys.stdout.isatty()))
    for name, command in commands.items():
        # In TRAINYARD_HOME rather than wherever the user stands: nothing is read from there.
        manager.add_process(name, command, env=dict(os.environ), cwd=str(home))
    manager.loop()
    return int(manager.returncode or 0)


if __name__ == "__main__":
    sys.exit(main())
