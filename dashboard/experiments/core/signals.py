"""Signals the experiments app sends, for apps above it to listen to without being imported.

`run_ended(sender=Experiment, experiment_id=...)`: a run reached one of transitions.ENDS, sent
once per run by the transition that moved it there, inside the caller's transaction (a
receiver that queues work defers it with transaction.on_commit). The notifications app
connects to it in its AppConfig.ready(), so experiments never imports notifications.
"""

from __future__ import annotations

from django.dispatch import Signal

run_ended = Signal()

# `straggler_named(sender=Experiment, experiment_id=..., text=...)`: the run's log and page named
# a rank markedly slower than the others (runs/stragglers.py), sent once per rank named, inside
# the transaction that stores the row's change with the log's line and the page's message;
# ``text`` is the sentence they show.
straggler_named = Signal()

# `run_stalled(sender=Experiment, experiment_id=..., text=...)`: a run's ranks made no step while
# their processes live, and its row took the stall (runs/stalls.py): sent once per stall that
# begins, where the row changes; ``text`` is the launcher's sentence, the run log's line.
run_stalled = Signal()
