"""What each worker machine last said about itself."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class WorkerMachineQuerySet(models.QuerySet["WorkerMachine"]):
    def online(self) -> WorkerMachineQuerySet:
        bound = timezone.now() - timedelta(seconds=settings.TRAINYARD_WORKER_STALE_SECONDS)
        return self.filter(reported_at__gte=bound)


class WorkerMachine(models.Model):
    hostname = models.CharField(max_length=255, unique=True)
    # Where the other machines reach this one (a multi-node run's rendezvous host and ranks):
    # TRAINYARD_WORKER_ADDRESS, else the address of this host's route to the broker.
    address = models.CharField(max_length=255, blank=True, help_text="reachable address")
    report = models.JSONField(default=dict, help_text="facts the worker collected itself")
    reported_at = models.DateTimeField(db_index=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)

    objects = WorkerMachineQuerySet.as_manager()

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    @property
    def is_online(self) -> bool:
        age = (timezone.now() - self.reported_at).total_seconds()
        return age <= settings.TRAINYARD_WORKER_STALE_SECONDS
