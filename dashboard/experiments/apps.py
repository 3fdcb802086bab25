from django.apps import AppConfig


class ExperimentsConfig(AppConfig):
    name = "dashboard.experiments"
    label = "experiments"
    verbose_name = "Experiments"

    def ready(self) -> None:
        # Connects the Celery worker_shutting_down handler; importing it starts nothing.
        # Connects the receiver that deletes a profile's files with its row (and so its run's).
        from dashboard.devices.signals import machine_joined
        from dashboard.experiments.core import profiles  # noqa: F401
        from dashboard.experiments.core.signals import run_ended
        from dashboard.experiments.queue_wake import machine_joined_wake, run_ended_wake
        from dashboard.experiments.runs import worker  # noqa: F401

        # Waiting runs are woken, never polled for (runs/parked.py).
        run_ended.connect(run_ended_wake, dispatch_uid="experiments.queue_wake")
        machine_joined.connect(machine_joined_wake, dispatch_uid="experiments.machine_joined")
