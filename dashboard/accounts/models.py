"""API tokens for scripts: `Authorization: Bearer <key>`."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


def new_token_key() -> str:
    # The prefix: a bare urlsafe key starts with "-" one time in 64, and then reads as an option
    # to whatever command it is passed to.
    return "ty_" + secrets.token_urlsafe(32)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64, unique=True, default=new_token_key)
    name = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user} · {self.name or self.key[:6] + '…'}"
