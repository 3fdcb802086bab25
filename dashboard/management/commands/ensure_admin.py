"""On first run, create an admin account and print its login once."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the first admin account (username 'admin') if there is no superuser yet."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username=username, email="", password=password)
        banner = "=" * 64
        self.stdout.write(
            f"{banner}\nFirst run: an admin account was created. It is shown only this once.\n"
            f"  username: {username}\n  password: {password}\n"
            f"Change it at /admin/password_change/ after logging in.\n{banner}"
        )
