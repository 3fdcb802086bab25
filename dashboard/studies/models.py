"""A study and the runs it launched. The runs are ordinary experiments; the link lives here, so
that dashboard.experiments knows nothing of studies."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

from dashboard.experiments.models import Experiment


class BatchMode(models.TextChoices):
    PER_PROCESS = "per_process", "Same batch per process"
    GLOBAL = "global", "Same global batch"


class Study(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="studies"
    )
    name = models.CharField(max_length=120)
    base = models.JSONField(default=dict, help_text="launch fields every run shares")
    axes = models.JSONField(default=dict, help_text="{field: [values]}: the runs are the product")
    # per_process: every run trains with the base batch size per process; global: the base batch
    # size is the global batch, divided over each run's world size.
    batch_mode = models.CharField(
        max_length=16, choices=BatchMode.choices, default=BatchMode.PER_PROCESS
    )
    target_accuracy = models.FloatField(help_text="test accuracy the table times, fraction 0..1")
    stop_at_target = models.BooleanField(
        default=False, help_text="each run ends after the epoch that reaches the target"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    stopped_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "studies"

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("study-detail", args=[self.pk])


class StudyRun(models.Model):
    """One run of a study: its cell (the axes' values, the seed among them) in grid order."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="study_runs")
    experiment = models.OneToOneField(
        Experiment, on_delete=models.CASCADE, related_name="study_run"
    )
    position = models.PositiveSmallIntegerField(help_text="order in the grid, from 0")
    values = models.JSONField(default=dict, help_text="this run's value of each axis")

    class Meta:
        ordering = ["study", "position"]
        constraints = [
            models.UniqueConstraint(fields=["study", "position"], name="study_run_position")
        ]

    def __str__(self) -> str:
        return f"run {self.position} of study #{self.study_id}"
