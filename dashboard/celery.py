"""The Celery application: `celery -A dashboard worker`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
# No CUDA call may happen in a process that forks (pytorch#40403): availability checks go to NVML.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
