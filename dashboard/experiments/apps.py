from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "dashboard.experiments"
    label = "experiments"
    verbose_name = "Experiments"

    def ready(self) -> None:
        # Connects the Celery worker_shutting_down handler; importing it starts nothing.
        # Connects the receiver that deletes a profile's files with its row (and so its run's).
        from dashboard.experiments.core import profiles  # noqa: F401
        from dashboard.experiments.core.signals import run_ended
        from dashboard.experiments.queue_wake import run_ended_wake
        from dashboard.experiments.runs import worker  # noqa: F401

        run_ended.connect(run_ended_wake, dispatch_uid="experiments.queue_wake")
