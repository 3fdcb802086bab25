"""The shape of a benchmark command that runs in a throwaway home (dashboard/serving.py's
throwaway_rerun): the user's command re-runs itself as a child on a temporary database, runs
folder and Redis, which migrates, makes the benchmark's user and measures."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.serving import throwaway_rerun

CHILD_ENV = "TRAINYARD_BENCH_CHILD"
THROWAWAY_PREFIX = "trainyard-bench-"  # throwaway_rerun's temporary home


def throwaway_child() -> bool:
    """Whether this process is the child that throwaway_rerun started. The marker alone is not
    enough: an exported TRAINYARD_BENCH_CHILD would make the benchmark migrate and write into
    the user's real database, so the home and the database must also be the parent's
    temporary ones."""
    from django.conf import settings

    if not os.environ.get(CHILD_ENV):
        return False
    home = Path(settings.VAR_DIR).resolve()
    database = Path(str(settings.DATABASES["default"].get("NAME", ""))).resolve()
    return (
        home.name.startswith(THROWAWAY_PREFIX)
        and home.parent == Path(tempfile.gettempdir()).resolve()
        and database.is_relative_to(home)
    )


class ThrowawayBenchCommand(BaseCommand):
    bench_name = ""  # the command's name, as manage.py takes it
    dry_run_help = ""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help=self.dry_run_help)

    def handle(self, *args: Any, **options: Any) -> None:
        if os.environ.get(CHILD_ENV) and not throwaway_child():
            raise CommandError(
                f"{CHILD_ENV} is set but TRAINYARD_HOME is not a throwaway home of "
                f"{self.bench_name}: unset it to run the benchmark"
            )
        if throwaway_child():
            from django.contrib.auth import get_user_model

            call_command("migrate", verbosity=0, interactive=False)
            owner = get_user_model().objects.create_user(username=self.bench_name)
            self.bench(owner=owner, options=options)
            return
        self.stdout.flush()
        argv = [self.bench_name, *self.child_options(options)]
        if throwaway_rerun(argv=argv, marker=CHILD_ENV):
            raise CommandError(f"{self.bench_name} failed")

    def child_options(self, options: dict[str, Any]) -> list[str]:
        """The user's options, as the child takes them again."""
        return ["--dry-run"] if options["dry_run"] else []

    def bench(self, *, owner: Any, options: dict[str, Any]) -> None:
        raise NotImplementedError
