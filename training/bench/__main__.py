"""``python -m training.bench engine|memory|parity|phases|script|observe|log|lm [options]``
(``--help`` on each)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = ("engine", "memory", "parity", "phases", "script", "observe", "log", "lm")
    if not args or args[0] not in commands:
        print(
            f"usage: python -m training.bench {{{','.join(commands)}}} [options]\n"
            "  engine  images/s of the engine's data path vs a DataLoader loop and compute only\n"
            "  memory  peak memory of N ranks sharing the dataset vs one process\n"
            "  parity  per strategy and option at one global batch: test accuracy over seeds,\n"
            "          images/s and memory per rank\n"
            "  phases  images/s with each rank's phases timed vs without (--no-phases)\n"
            "  script  a user's DDP script's images/s under Trainyard vs bare torchrun\n"
            "  observe a user's DDP and FSDP2 scripts' images/s observed in each rank vs bare\n"
            "  log     one run.log of five figures vs wandb.log and mlflow.log_metrics\n"
            "  lm      byte-llama's tokens/s in the engine's loop vs a bare nanoGPT loop, and\n"
            "          tokens/s, memory per rank and bits per byte of every strategy",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"training.bench.{args[0]}")
    code: int = module.main(args[1:])
    return code


if __name__ == "__main__":
    raise SystemExit(main())
