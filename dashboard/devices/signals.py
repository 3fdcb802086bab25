"""Signals the devices app sends, for apps above it to listen to without being imported.

`machine_joined(sender=WorkerMachine, hostname=...)`: a worker's report brought its machine
online (its first report, the first of a restarted worker, or one after a silence): the
experiments app wakes the queued runs whose turn it is there (experiments/queue_wake.py).
"""

from __future__ import annotations

from django.dispatch import Signal

machine_joined = Signal()
