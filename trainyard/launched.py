"""`python -m trainyard.launched -- ENTRY ARGS...`: what torchrun starts on each rank of a script
run; it runs ENTRY as `python ENTRY ARGS...` would (`__main__`, its folder first on sys.path,
sys.argv as the script expects), through runpy, as TraceML does: the one place where what must
be in place before the script's first line goes: the frameworks' integrations
(trainyard/integrations/), attached when the script imports each framework.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from trainyard.hooks import hooks_install
from trainyard.integrations import hooks_wanted


def main(argv: Sequence[str]) -> None:
    argv = list(argv)
    if argv[:1] == ["--"]:  # torchrun passes "--" through or drops it depending on the version
        argv = argv[1:]
    if not argv:
        raise SystemExit("usage: python -m trainyard.launched -- ENTRY [ARGS...]")
    path = os.path.abspath(argv[0])
    sys.argv = [path, *argv[1:]]
    # `python ENTRY` puts ENTRY's folder first; `-m` put the working directory there.
    sys.path[0] = os.path.dirname(path)
    hooks_install(hooks_wanted())
    entry_run(path)


def entry_run(path: str) -> None:
    """ENTRY run, then what it left freed while the interpreter still runs. A DDP module sits in
    reference cycles: left to the interpreter's end, it goes in finalization's collection, and
    a Gloo worker thread still releasing a collective's tensors then finds Python finalizing,
    is ended mid-destructor and aborts the rank ("terminate called without an active
    exception": 4 in 30 runs of tests/scripts/observed under torchrun --tee, with or without
    Trainyard; 0 in 40 once collected here). An exception's frames hold the script's globals:
    a SystemExit's code is kept, another's traceback printed (exit status 1, as Python's), the
    exception dropped, then collected."""
    leaving: tuple[object] | None = None
    try:
        runpy.run_path(path, run_name="__main__")  # the globals it returns, dropped
    except SystemExit as exit_:
        leaving = (exit_.code,)
    except Exception:  # said as Python says it, then the same exit status (1)
        traceback.print_exc()
        leaving = (1,)
    gc.collect()
    if leaving is not None:
        sys.stderr.flush()
        raise SystemExit(leaving[0])


if __name__ == "__main__":
    main(sys.argv[1:])
