"""API tokens for scripts: `Authorization: Bearer <key>`.

Only a SHA-256 of each key is stored (a leaked database or backup gives no usable key) with a short
visible prefix to tell tokens apart. The key itself is shown once, when the token is made: a
freshly created ApiToken carries it in `key`, which is never saved.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

KEY_PREFIX = "ty_"
# "ty_" and the first characters of the random part: enough to tell a user's tokens apart,
# far too few to guess the rest.
VISIBLE_CHARS = 8


def new_token_key() -> str:
    # The prefix: a bare urlsafe key starts with "-" one time in 64, and then reads as an option
    # to whatever command it is passed to.
    return KEY_PREFIX + secrets.token_urlsafe(32)


def token_key_hash(key: str) -> str:
    # A plain SHA-256 is enough: keys are 256 random bits, so there is nothing to brute-force,
    # and a lookup by hash stays one indexed query per request.
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def token_key_prefix(key: str) -> str:
    return key[:VISIBLE_CHARS]


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False, help_text="the key's first characters")
    created_at = models.DateTimeField(auto_now_add=True)
    # Optional: past it the key is refused like a revoked one (HTTP 401, sockets closed).
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, db_index=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    # The plain key of a token made in this process, for showing it once; never stored.
    key: str | None = None

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.user} · {self.name or self.prefix + '…'}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.key_hash:
            self.key = new_token_key()
            self.key_hash = token_key_hash(self.key)
            self.prefix = token_key_prefix(self.key)
        super().save(*args, **kwargs)

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()
