from django.contrib import admin

from dashboard.studies.models import Study, StudyRun


class StudyRunInline(admin.TabularInline):
    model = StudyRun
    extra = 0
    raw_id_fields = ("experiment",)
    readonly_fields = ("position", "values")


@admin.register(Study)
class StudyAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "target_accuracy", "stop_at_target", "created_at")
    list_filter = ("stop_at_target", "batch_mode")
    search_fields = ("name", "owner__username")
    readonly_fields = ("created_at", "stopped_at", "stopped_by")
    inlines = [StudyRunInline]
