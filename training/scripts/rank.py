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
    observer = None
    try:
        observer = observer_install()
    except Exception as error:  # noqa: BLE001 - the script runs, observed or not
        print(f"trainyard's observer could not start ({type(error).__name__}: {error}); "
              "the script runs unobserved", file=sys.stderr, flush=True)  # fmt: skip
    try:
        script_run(argv)
    finally:
        if observer is not None:
            observer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
