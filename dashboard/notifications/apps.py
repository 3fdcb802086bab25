from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "dashboard.notifications"
    label = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # Here, not in experiments: the experiments app sends run_ended and never imports us.
        from dashboard.experiments.core.signals import run_ended, run_stalled, straggler_named
        from dashboard.notifications.services import (
            run_ended_receive,
            run_stalled_receive,
            straggler_named_receive,
        )

        run_ended.connect(run_ended_receive, dispatch_uid="notifications.run_ended")
        straggler_named.connect(
            straggler_named_receive, dispatch_uid="notifications.straggler_named"
        )
        run_stalled.connect(run_stalled_receive, dispatch_uid="notifications.run_stalled")
