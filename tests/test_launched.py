"""`python -m trainyard.launched -- ENTRY`, what torchrun starts on each rank of a script run:
what the script leaves behind is freed while the interpreter still runs (a DDP module's cycles
freed in finalization abort a Gloo rank now and then), and its exit code is its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# An object in a reference cycle, as DDP's module is, that says when it goes.
CYCLE = """
    import sys

    class Held:
        def __init__(self):
            self.me = self

        def __del__(self):
            print(f"freed, finalizing: {sys.is_finalizing()}", flush=True)

    held = Held()
"""


def entry(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(CYCLE) + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "trainyard.launched", "--", str(script)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("", 0),
        # The frames of a SystemExit raised in a function hold the script's globals.
        ("def main():\n    sys.exit(0)\nmain()\n", 0),
        ("def main():\n    sys.exit(3)\nmain()\n", 3),
        ("del held\n", 0),  # dropped by the script: freed only by a collection
        ("def main():\n    raise ValueError('bad data')\nmain()\n", 1),
    ],
)
def test_what_a_script_leaves_is_freed_before_the_interpreter_finalizes(
    tmp_path: Path, body: str, code: int
) -> None:
    done = entry(tmp_path, body)
    assert done.returncode == code, done.stderr
    assert done.stdout.splitlines() == ["freed, finalizing: False"], done.stderr


def test_a_scripts_exit_message_is_said_as_python_says_it(tmp_path: Path) -> None:
    done = entry(tmp_path, "sys.exit('no data found')\n")
    assert done.returncode == 1
    assert done.stderr.strip().endswith("no data found")


def test_a_scripts_error_is_said_as_python_says_it(tmp_path: Path) -> None:
    done = entry(tmp_path, "def main():\n    raise ValueError('bad data')\nmain()\n")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "in main" in done.stderr
    assert lines[-1] == "ValueError: bad data"
