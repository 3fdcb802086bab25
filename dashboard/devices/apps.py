from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "dashboard.devices"
    label = "devices"
    verbose_name = "Worker machines"

    def ready(self) -> None:
        # Connects the Celery worker_ready/worker_shutdown handlers; no torch, no CUDA here.
        from dashboard.devices import worker  # noqa: F401
