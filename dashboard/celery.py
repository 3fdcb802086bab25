"""The Celery application: `celery -A dashboard worker`.

Every worker consumes the shared queue ("celery") and its own machine's queue,
`machine.<TRAINYARD_WORKER_NAME or host name>`, with no flag to remember: a node of a
multi-node run, or a run pinned to a machine, is sent to that machine's queue.
"""

import os
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
# No CUDA call may happen in a process that forks (pytorch#40403): availability checks go to NVML.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

app = Celery("dashboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_after_setup.connect(dispatch_uid="trainyard-machine-queue")
def machine_queue_add(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    # Celery's documented way to give a worker a queue of its own (the "dedicated queue per
    # worker" example of its signals guide); it runs before the consumer starts.
    from dashboard.devices.facts import machine_name, machine_queue

    instance.app.amqp.queues.select_add(machine_queue(machine_name()))
