"""``python -m training.bench log``: what one `run.log` of five figures costs a training loop,
against `wandb.log` (offline mode) and `mlflow.log_metrics` (a local file store).

Each library runs in a process of its own (a new interpreter: no library's threads or imports
weigh on another's loop), the same loop: ``--calls`` calls, each logging five figures at the next
step, timed after ``--warmup`` calls; Trainyard's as under a launch (its rank's event file), so
the figure is what a launched script pays. Prints microseconds per call for each, and each one's
ratio to Trainyard's; a library that is not installed is said to be missing (``pip install -e
'.[bench]'`` installs both). The last line, ``log ratio``, is the fastest other library's time
over Trainyard's: above 1, Trainyard's call is the cheaper.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOOP = """
import time
figures = lambda i: {"loss": 1.0 / (i + 1), "accuracy": i / 1e4, "lr": 0.1, "grad_norm": 2.5,
                     "images_per_second": 900.0 + i}
for i in range(WARMUP):
    LOG(figures(i), i)
began = time.perf_counter()
for i in range(WARMUP, WARMUP + CALLS):
    LOG(figures(i), i)
print("us_per_call", (time.perf_counter() - began) / CALLS * 1e6)
FINISH()
"""

# What each library does before its loop, how it logs one call, and how it ends.
LIBRARIES = {
    "trainyard": ("trainyard", "import trainyard\nrun = trainyard.init()\n",
                  "lambda f, i: run.log(f, step=i)", "run.finish"),
    "wandb": ("wandb", "import wandb\nrun = wandb.init(mode='offline', dir=FOLDER, "
              "project='bench')\n", "lambda f, i: run.log(f, step=i)", "run.finish"),
    "mlflow": ("mlflow", "import mlflow\nmlflow.set_tracking_uri('file:' + FOLDER)\n"
               "mlflow.set_experiment('bench')\nmlflow.start_run()\n",
               "lambda f, i: mlflow.log_metrics(f, step=i)", "mlflow.end_run"),
}  # fmt: skip


def microseconds(name: str, *, calls: int, warmup: int) -> float | None:
    module, setup, log, finish = LIBRARIES[name]
    if importlib.util.find_spec(module) is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        code = (f"FOLDER = {folder!r}\nWARMUP, CALLS = {warmup}, {calls}\n{setup}"
                f"LOG, FINISH = {log}, {finish}\n{LOOP}")  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "WANDB_"))}
        # MLflow 3 keeps its file store (the "local file store") behind this switch.
        env.update(PYTHONPATH=str(ROOT), WANDB_SILENT="true", TRAINYARD_EVENTS_DIR=folder,
                   MLFLOW_ALLOW_FILE_STORE="true", TRAINYARD_RUN_ID="1")  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=folder,
                              capture_output=True, text=True, check=False)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("us_per_call")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return float(lines[-1].split()[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.bench log")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--dry-run", action="store_true", help="a few calls each")
    args = parser.parse_args(argv)
    calls, warmup = (50, 5) if args.dry_run else (args.calls, args.warmup)
    found = {name: microseconds(name, calls=calls, warmup=warmup) for name in LIBRARIES}
    ours = found["trainyard"]
    assert ours is not None  # the library is this project's own
    print(f"{'library':10} {'us/call':>10} {'vs trainyard':>13}")
    for name, figure in found.items():
        if figure is None:
            print(f"{name:10} {'missing':>10}   (pip install -e '.[bench]')")
        else:
            print(f"{name:10} {figure:10.1f} {figure / ours:12.2f}x")
    others = [figure for name, figure in found.items() if name != "trainyard" and figure]
    print(f"log ratio: {min(others) / ours:.3f}" if others else "log ratio: none to compare")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
