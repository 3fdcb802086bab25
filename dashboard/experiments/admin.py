from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from dashboard.experiments.core.descriptions import (
    experiment_duration_seconds,
    experiment_options_label,
)
from dashboard.experiments.core.forms import FIELDS, SCRIPT_FIELDS
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.metrics.series import series_buckets
from dashboard.experiments.models import Checkpoint, CodeArchive, Experiment, LogLine
from dashboard.experiments.services import (
    experiment_checkpoint_request,
    experiment_clone,
    experiment_stop,
)
from training.registry import OPTIONS_DECLARED


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LogLineInline(ReadOnlyInline):
    model = LogLine
    fields = ("seq", "time", "level", "message")
    readonly_fields = fields


class CheckpointInline(ReadOnlyInline):
    model = Checkpoint
    fields = ("epoch", "step", "path", "size", "worker", "created")
    readonly_fields = fields


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = (
        "name", "status", "strategy", "options", "model", "dataset", "owner", "priority",
        "accuracy", "duration", "created_at",
    )  # fmt: skip
    # Every strategy option the registry declares filters too (null: its strategy does not
    # read it).
    list_filter = (
        "status", "strategy", *(option.name for option in OPTIONS_DECLARED), "model", "dataset",
        "owner", "priority",
    )  # fmt: skip
    search_fields = ("name",)
    date_hierarchy = "created_at"
    actions = ("stop_runs", "checkpoint_runs", "clone_and_relaunch")
    inlines = (LogLineInline, CheckpointInline)
    readonly_fields = (
        "series_summary",
        "status",
        "created_at",
        "started_at",
        "finished_at",
        "worker",
        "error",
        "test_loss",
        "test_accuracy",
        "epoch",
        "step",
        "total_steps",
        "last_seq",
        "notes",
        "run_info",
        "rank_stats",
        "cancel_requested_at",
        "cancelled_by",
        "resume_requested",
        "checkpoint_requested_at",
        "checkpoint_requested_by",
        "launcher_pid",
        "cloned_from",
        # What the run was launched with is its record; the New run page and the API validate
        # a launch (devices, limits) and hand it to a worker, which the admin's form would not.
        *(name for name in FIELDS if name != "name"),
        # A script run's code, entry point and arguments: what ran, as the API checked it.
        *SCRIPT_FIELDS,
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="options")
    def options(self, obj: Experiment) -> str:
        """The strategy options off their default, in the registry's words ("PowerSGD")."""
        return experiment_options_label(experiment=obj) or "–"

    @admin.display(description="test accuracy", ordering="test_accuracy")
    def accuracy(self, obj: Experiment) -> str:
        return "–" if obj.test_accuracy is None else f"{obj.test_accuracy:.2%}"

    @admin.display(description="series")
    def series_summary(self, obj: Experiment) -> str:
        """One line a series (its points, range and last value): a long run has 100,000s of
        points, too many for an inline; the run page and the API draw and page them."""
        rows = series_buckets(experiment=obj, budget=1).items()
        return format_html_join(
            "\n",
            "<div>{}: {} points, min {}, max {}, last {}</div>",
            ((key, s["count"], s["buckets"][0][4], s["buckets"][0][5], s["buckets"][0][7])
             for key, s in rows),
        )  # fmt: skip

    @admin.display(description="duration")
    def duration(self, obj: Experiment) -> str:
        seconds = experiment_duration_seconds(experiment=obj)
        if seconds is None:
            return "–"
        minutes, secs = divmod(int(seconds), 60)
        return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"

    @admin.action(description="Stop the selected runs")
    def stop_runs(self, request: HttpRequest, queryset: QuerySet[Experiment]) -> None:
        stopped = sum(experiment_stop(experiment=e, by=request.user) for e in queryset)
        self.message_user(request, f"Stop requested for {stopped} run(s).", messages.SUCCESS)

    @admin.action(description="Write a checkpoint of the selected running runs now")
    def checkpoint_runs(self, request: HttpRequest, queryset: QuerySet[Experiment]) -> None:
        refused = {
            e.pk: reason
            for e in queryset
            if (reason := experiment_checkpoint_request(experiment=e, by=request.user))
        }
        asked = queryset.count() - len(refused)
        self.message_user(request, f"Checkpoint requested of {asked} run(s).", messages.SUCCESS)
        for pk, reason in refused.items():
            self.message_user(request, f"#{pk}: {reason}.", messages.WARNING)

    @admin.action(description="Clone and relaunch the selected runs")
    def clone_and_relaunch(self, request: HttpRequest, queryset: QuerySet[Experiment]) -> None:
        clones: list[Experiment] = []
        try:
            for experiment in queryset:
                clones.append(experiment_clone(experiment=experiment, owner=request.user))
        except LaunchLimited as refused:
            # Staff launch under the same per-user limits: say where it stopped, and why.
            self.message_user(request, f"Stopped cloning: {refused.message}.", messages.WARNING)
        names = ", ".join(f"#{c.pk}" for c in clones)
        self.message_user(request, f"Queued {len(clones)} new run(s): {names}.", messages.SUCCESS)


@admin.register(CodeArchive)
class CodeArchiveAdmin(admin.ModelAdmin):
    """Uploaded code, read only: it is uploaded through the API (POST /api/code/) by those
    granted experiments.run_script (a user's permissions, on the user's page here)."""

    list_display = ("id", "owner", "sha256", "kind", "files", "bytes", "created_at")
    list_filter = ("kind",)
    search_fields = ("sha256", "owner__username")
    readonly_fields = (*list_display, "unpacked_bytes")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
