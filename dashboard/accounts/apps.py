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
        sockets_connect()


def sockets_connect() -> None:
    """What ends or narrows a user's access tells the user's open sockets (sockets.py)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.signals import user_logged_out
    from django.db.models.signals import post_delete, post_save, pre_save

    from dashboard.accounts import sockets

    user = get_user_model()
    user_logged_out.connect(sockets.user_logged_out_sockets, dispatch_uid="accounts.sockets")
    pre_save.connect(sockets.user_saving, sender=user, dispatch_uid="accounts.sockets")
    post_save.connect(sockets.user_saved, sender=user, dispatch_uid="accounts.sockets")
    post_delete.connect(sockets.user_deleted, sender=user, dispatch_uid="accounts.sockets")
