from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from dashboard.accounts.models import ApiToken
from dashboard.accounts.services import token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    readonly_fields = (
        "user",
        "prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
        "revoked_by",
    )
    search_fields = ("user__username", "name", "prefix")
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A token made here would have a key nobody ever sees (only its hash is stored): users
        # make their own on the Tokens page, scripts with `manage.py create_token`.
        return False

    @admin.action(description="Revoke selected tokens (their next request gets a 401)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = sum(token_revoke(token=token, by=request.user) for token in queryset)
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
