from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "dashboard.experiments"
    label = "experiments"
    verbose_name = "Experiments"

    def ready(self) -> None:
        # Connects the Celery worker_shutting_down handler; importing it starts nothing.
        from dashboard.experiments import worker  # noqa: F401
        from dashboard.experiments.queue_wake import run_ended_wake
        from dashboard.experiments.signals import run_ended

        run_ended.connect(run_ended_wake, dispatch_uid="experiments.queue_wake")
