from django.contrib import admin
from django.http import HttpRequest

from dashboard.devices.models import WorkerMachine


@admin.register(WorkerMachine)
class WorkerMachineAdmin(admin.ModelAdmin):
    """Read-only: rows belong to the workers, which rewrite them every few seconds."""

    list_display = ("hostname", "address", "online", "reported_at")
    search_fields = ("hostname",)
    readonly_fields = ("hostname", "address", "reported_at", "first_seen_at", "report")

    @admin.display(boolean=True, description="online")
    def online(self, machine: WorkerMachine) -> bool:
        return machine.is_online

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: WorkerMachine | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: WorkerMachine | None = None) -> bool:
        return False
