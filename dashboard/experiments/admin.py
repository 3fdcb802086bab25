"""The admin of runs (issue 34 item 12: an admin worth opening): a list whose columns fit and
whose filters mean something, and a change page that reads: what was launched, what the run
reported, its bookkeeping, each folded, the reports' JSON formatted and read only (a run's record
changes through the dashboard and its API; here only its name, tags' neighbour note and queue
priority)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from dashboard.experiments.core.descriptions import (
    experiment_dataset_label,
    experiment_duration_seconds,
    experiment_options_label,
    experiment_strategy_label,
)
from dashboard.experiments.core.forms import FIELDS, SCRIPT_FIELDS
from dashboard.experiments.core.limits import LaunchLimited
from dashboard.experiments.metrics.series import series_buckets
from dashboard.experiments.models import Checkpoint, CodeArchive, Experiment, LogLine
from dashboard.experiments.services import (
    experiment_checkpoint_request,
    experiment_clone,
    experiments_stop,
    queue_turns_changed,
    slurm_priority_changed,
)
from training.registry import STRATEGIES

# The fields a person may change here: the run's name, its note and its place in the queue.
EDITABLE = ("name", "note", "priority")
# The change page's first, open part: what the run is and how it ended.
SUMMARY = (
    "name", "status", "owner", "strategy", "model", "dataset", "test_accuracy", "test_loss",
    "epoch", "step", "total_steps", "created_at", "started_at", "finished_at", "worker", "error",
    "tags", "note", "priority",
)  # fmt: skip
# The JSON the run and its workers wrote, shown formatted (a <pre> each) rather than as one line.
JSON_FIELDS = tuple(
    f.name for f in Experiment._meta.get_fields() if isinstance(f, models.JSONField)
)


def _json_display(name: str) -> Callable[[Any, Experiment], str]:
    def show(self: Any, obj: Experiment) -> str:
        value = getattr(obj, name)
        if value in (None, "", [], {}):
            return "–"
        if name == "tags":
            return ", ".join(map(str, value))
        return format_html('<pre class="json">{}</pre>', json.dumps(value, indent=2))

    show.short_description = name.replace("_", " ")  # type: ignore[attr-defined]
    return show


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False
    classes = ("collapse",)  # folded: a long run's log is thousands of lines

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LogLineInline(ReadOnlyInline):
    model = LogLine
    fields = ("seq", "time", "rank", "level", "message")
    readonly_fields = fields


class CheckpointInline(ReadOnlyInline):
    model = Checkpoint
    fields = ("epoch", "step", "path", "size", "worker", "created")
    readonly_fields = fields


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    # Seven columns that fit beside the admin's menu at 1280 px: the strategy short with its
    # options (the whole label its tooltip), the model on its data in one.
    list_display = (
        "name", "status", "strategy_label", "model_label", "owner", "accuracy", "duration",
    )  # fmt: skip
    # What a person looks for runs by; not each strategy option, whose values read "1" or "-".
    list_filter = ("status", "strategy", "dataset", "model", "imported", "reported", "owner")
    search_fields = ("name", "tags", "note")
    date_hierarchy = "created_at"
    actions = ("stop_runs", "checkpoint_runs", "clone_and_relaunch")
    inlines = (CheckpointInline, LogLineInline)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Experiment, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if "priority" in form.changed_data:  # a queued run may be next among its owner's now
            queue_turns_changed()
            slurm_priority_changed(experiment_id=obj.pk)

    def _shown(self, name: str) -> str:
        return f"{name}_json" if name in JSON_FIELDS else name

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        """Every field but EDITABLE: what the run was launched with is its record (the New run
        page and the API validate a launch and hand it to a worker, which this form would not);
        what it reported is the workers'."""
        names = [f.name for f in Experiment._meta.concrete_fields if f.name != "id"]
        return ["series_summary", *(self._shown(n) for n in names if n not in EDITABLE)]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        names = [f.name for f in Experiment._meta.concrete_fields if f.name != "id"]
        launch = [n for n in (*FIELDS, *SCRIPT_FIELDS) if n in names and n not in SUMMARY]
        reported = [n for n in JSON_FIELDS if n not in (*SUMMARY, *launch)]
        rest = [n for n in names if n not in (*SUMMARY, *launch, *reported)]
        folded = ["collapse"]
        return (
            (None, {"fields": [self._shown(n) for n in SUMMARY]}),
            ("Launched with", {"fields": [self._shown(n) for n in launch], "classes": folded}),
            ("What it reported", {
                "fields": ["series_summary", *(self._shown(n) for n in reported)],
                "classes": folded,
            }),
            ("Requests and bookkeeping", {"fields": rest, "classes": folded}),
        )  # fmt: skip

    @admin.display(description="strategy", ordering="strategy")
    def strategy_label(self, obj: Experiment) -> str:
        """The short name and the options off their default ("DDP (PowerSGD)"), the whole
        label its tooltip."""
        spec = STRATEGIES.get(obj.strategy)
        options = experiment_options_label(experiment=obj)
        short = (spec.short if spec else obj.strategy) + (f" ({options})" if options else "")
        return format_html(
            '<abbr title="{}">{}</abbr>', experiment_strategy_label(experiment=obj), short
        )

    @admin.display(description="model and data", ordering="model")
    def model_label(self, obj: Experiment) -> str:
        return f"{obj.model} on {experiment_dataset_label(experiment=obj)}"

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
        stopped = len(experiments_stop(experiments=queryset, by=request.user))
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


for _name in JSON_FIELDS:
    setattr(ExperimentAdmin, f"{_name}_json", _json_display(_name))


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
