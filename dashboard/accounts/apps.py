from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "dashboard.accounts"
    label = "accounts"
    verbose_name = "API tokens"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_login_failed

        from dashboard.accounts.throttles import login_failure_record

        # Every failed authenticate() (the login pages, POST /api/tokens/) counts toward the
        # login limits.
        user_login_failed.connect(login_failure_record, dispatch_uid="accounts.login_failed")
