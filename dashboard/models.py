"""The rows of the limits in dashboard/rates.py that count actions leaving no row of their own."""

from __future__ import annotations

from django.db import models


class RateEvent(models.Model):
    """One counted action: a failed login (one row for the account tried, one for the client's
    address), an import tried. Kept for as long as a limit counts it (rates.rate_event_record
    deletes the older ones of its kind)."""

    kind = models.CharField(max_length=32)
    # The username tried, the client's address, a user's id: what the limit is per.
    key = models.CharField(max_length=150)
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["kind", "key", "at"], name="rate_event_count"),
            models.Index(fields=["kind", "at"], name="rate_event_expiry"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} at {self.at:%Y-%m-%d %H:%M:%S}"
