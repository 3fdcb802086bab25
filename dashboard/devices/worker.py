"""Celery hookup: every worker reports its machine while it runs.

Imported from DevicesConfig.ready(), which `celery -A dashboard worker` reaches through Celery's
Django fix-up (django.setup()) before the worker is ready. Importing is all that happens there;
facts (and torch) are only touched in the reporter thread once the worker is up.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready, worker_shutdown

logger = logging.getLogger(__name__)


@worker_ready.connect(dispatch_uid="trainyard-devices-worker-ready")
def worker_ready_report(sender: Any = None, **kwargs: Any) -> None:
    # worker_ready fires in the worker's main process, after the pool has forked: one reporter
    # per worker, and no reporter thread copied into pool children.
    from dashboard.devices.reporter import reporter_start

    reporter_start()


@worker_shutdown.connect(dispatch_uid="trainyard-devices-worker-shutdown")
def worker_shutdown_report(sender: Any = None, **kwargs: Any) -> None:
    from dashboard.devices.reporter import reporter_stop

    reporter_stop()
