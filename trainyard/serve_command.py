"""`trainyard server [--port N]` and `trainyard worker`: the dashboard, and a worker that trains
on this machine, from an installed wheel, as `make run` and `make worker` start them in a clone.

This package never imports Django (the client runs where no server does), so each command
becomes the server side's own entry in this same interpreter, by exec: Ctrl-C and SIGTERM reach
it directly, with no process of ours in between. Both are a local dashboard's unless the
environment says otherwise (TRAINYARD_DEBUG=1, as the Makefile sets it); the server's
settings (REDIS_URL, DATABASE_URL, TRAINYARD_HOME, ...) come from the environment as usual.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

from trainyard.commands import EXIT_USAGE, fail

DEFAULT_PORT = 8000


def serve_parsers(sub: Any) -> list[argparse.ArgumentParser]:
    server = sub.add_parser(
        "server",
        help="serve the dashboard here: Redis, the web server, a worker and beat (make run)",
        description="Migrate, make the first admin (its password printed once), then run "
        "Redis, daphne, a Celery worker and beat until Ctrl-C. Data goes to TRAINYARD_HOME "
        "(default ~/.local/share/trainyard).",
    )
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    server.add_argument("--verbose", action="store_true",
                        help="the services' banners, every task and every request")  # fmt: skip
    server.set_defaults(handler=cmd_server)
    worker = sub.add_parser(
        "worker",
        help="a Celery worker that trains on this machine (make worker)",
        description="Consume the server's queue and its machine's own; report this machine on "
        "the device page. Another machine needs the server's broker and database.",
    )
    worker.add_argument("--redis-url", help="the server's broker (REDIS_URL)")
    worker.add_argument("--database-url", help="the server's database (DATABASE_URL)")
    worker.add_argument("--name", help="this machine's name (TRAINYARD_WORKER_NAME; host name)")
    worker.add_argument("--concurrency", type=int, help="pool processes (Celery's default: cores)")
    worker.set_defaults(handler=cmd_worker)
    return [server, worker]


def cmd_server(args: argparse.Namespace) -> int:
    return _server_side_exec(["-m", "dashboard.server", "--port", str(args.port),
                              *(["--verbose"] if args.verbose else [])], {})  # fmt: skip


def cmd_worker(args: argparse.Namespace) -> int:
    argv = ["-m", "celery", "-A", "dashboard", "worker", "--loglevel", "INFO"]
    if args.name:
        argv += ["-n", f"{args.name}@%h"]  # apart from another worker on this host
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    settings = {"REDIS_URL": args.redis_url, "DATABASE_URL": args.database_url,
                "TRAINYARD_WORKER_NAME": args.name}  # fmt: skip
    return _server_side_exec(argv, {key: value for key, value in settings.items() if value})


def _server_side_exec(argv: list[str], settings: dict[str, str]) -> int:
    if importlib.util.find_spec("dashboard") is None:
        return fail("the dashboard is not installed here (pip install trainyard)", EXIT_USAGE)
    env = {"TRAINYARD_DEBUG": "1", **os.environ, **settings}
    sys.stdout.flush()
    # -P: the folder the user stands in is never searched for modules (their own `training/`).
    os.execve(sys.executable, [sys.executable, "-P", *argv], env)
    return 0  # not reached: exec replaced this process
