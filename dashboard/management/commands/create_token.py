"""Create an API token for a user, for scripts: `Authorization: Bearer <token>`."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard.accounts.services import token_create


class Command(BaseCommand):
    help = (
        "Create an API token for USERNAME and print its key (shown this once: only a hash is kept)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        _, key = token_create(user=user, name=name)
        self.stdout.write(key)
