"""``python -m training.scripts.rank -- ENTRY ARGS...``: what torchrun starts on each rank of a
script run: the observer (observer.py: where each step's time goes, with no line of the script
changed) installed first, then the script run as ``python ENTRY ARGS`` would run it
(trainyard.launched: its frameworks' integrations, runpy). TRAINYARD_OBSERVE=0 leaves the
observer out."""

from __future__ import annotations

import sys

from training.scripts.observer import observer_install
from trainyard.launched import main as script_run


def main(argv: list[str]) -> None:
    observer_install()
    script_run(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
