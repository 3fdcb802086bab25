"""The shape of a benchmark command that runs in a throwaway home (dashboard/serving.py's
throwaway_rerun): the user's command re-runs itself as a child on a temporary database, runs
folder and Redis, which migrates, makes the benchmark's user and measures."""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.serving import throwaway_rerun

CHILD_ENV = "TRAINYARD_BENCH_CHILD"


class ThrowawayBenchCommand(BaseCommand):
    bench_name = ""  # the command's name, as manage.py takes it
    dry_run_help = ""

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help=self.dry_run_help)
        parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["child"] or os.environ.get(CHILD_ENV):
            from django.contrib.auth import get_user_model

            call_command("migrate", verbosity=0, interactive=False)
            owner = get_user_model().objects.create_user(username=self.bench_name)
            self.bench(owner=owner, options=options)
            return
        self.stdout.flush()
        argv = [self.bench_name, "--child", *self.child_options(options)]
        if throwaway_rerun(argv=argv, marker=CHILD_ENV):
            raise CommandError(f"{self.bench_name} failed")

    def child_options(self, options: dict[str, Any]) -> list[str]:
        """The user's options, as the child takes them again."""
        return ["--dry-run"] if options["dry_run"] else []

    def bench(self, *, owner: Any, options: dict[str, Any]) -> None:
        raise NotImplementedError
