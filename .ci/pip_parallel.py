"""pip install, with the wheels unpacked by several pip processes at once.

    python .ci/pip_parallel.py -e '.[dev]'

pip resolves first (``--dry-run --report``), then unpacks and writes one wheel after another on
one core: 3 GB of wheels (torch's and its CUDA libraries') take it about 90 s here. This resolves
once, deals the wheels out to one pip process per core (at most ``MAX_PARTS``), the largest
first to the lightest part, so that each unpacks about as many bytes (measured on 2 cores: 91 s
one after another, 49 s in two halves), then runs the plain ``pip install`` of the arguments,
which finds everything in place and installs the project itself (about 3 s), so pip's own
check of the requirements has the last word. Every pip call gets ``--no-compile``: the Makefile
byte-compiles on every core afterwards. The whole install: 64 s here, where pip alone took 85 s.

What the environment already holds in another version (an update after pyproject.toml
changed; in a fresh venv, its own setuptools) is installed first, by one pip alone: an
upgrade's uninstall may move a shared folder (``nvidia/``) aside while another part writes into
it. And the wheels a part installed lose pip's ``REQUESTED`` mark, which ``-r`` gave them: as
after a plain install, only the project was asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

MAX_PARTS = 4
UNKNOWN_SIZE = 100_000  # a wheel pip would fetch from an index: small, as most are


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args, "--quiet", "--no-compile"]


def wheels(report: dict[str, Any]) -> list[tuple[int, str]]:
    """(size in bytes, ``name==version``) of each distribution the report installs from an
    index or a file, not the local project (a ``dir_info`` one: the final install does it)."""
    found = []
    for item in report.get("install", []):
        info = item.get("download_info", {})
        if "dir_info" in info:
            continue
        url = urlsplit(str(info.get("url", "")))
        path = Path(unquote(url.path)) if url.scheme == "file" else None  # "+" is "%2B" there
        size = path.stat().st_size if path is not None and path.is_file() else UNKNOWN_SIZE
        meta = item["metadata"]
        found.append((size, f"{meta['name']}=={meta['version']}"))
    return found


def parts_dealt(found: list[tuple[int, str]], count: int) -> list[list[str]]:
    """The wheels dealt into ``count`` parts of about equal bytes, largest first to the part
    with the fewest bytes (longest-processing-time-first); empty parts left out."""
    parts: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, count))]
    for size, spec in sorted(found, reverse=True):
        lightest = min(range(len(parts)), key=lambda i: parts[i][0])
        total, specs = parts[lightest]
        parts[lightest] = (total + size, [*specs, spec])
    return [specs for _, specs in parts if specs]


def parts_install(parts: list[list[str]], folder: Path) -> None:
    running = []
    for number, specs in enumerate(parts):
        listing = folder / f"part-{number}.txt"
        listing.write_text("\n".join(specs) + "\n")
        running.append(subprocess.Popen(pip("install", "--no-deps", "-r", str(listing))))
    failed = [proc.args for proc in running if proc.wait() != 0]
    if failed:
        raise SystemExit(f"pip_parallel: {len(failed)} of {len(running)} installs failed")


def names(specs: list[str]) -> set[str]:
    return {_normal(spec.split("==", 1)[0]) for spec in specs}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed_names(path: list[str] | None = None) -> set[str]:
    """The distributions on ``path`` (default: this interpreter's), by normalised name."""
    dists = metadata.distributions(path=path) if path else metadata.distributions()
    return {_normal(dist.metadata["Name"] or "") for dist in dists}


def requested_unmark(wanted: set[str], path: list[str] | None = None) -> None:
    """Drop pip's REQUESTED mark from the ``wanted`` distributions on ``path``."""
    for dist in metadata.distributions(path=path) if path else metadata.distributions():
        if _normal(dist.metadata["Name"] or "") not in wanted:
            continue
        for file in dist.files or []:
            if file.name == "REQUESTED" and file.parent.name.endswith(".dist-info"):
                Path(str(file.locate())).unlink(missing_ok=True)


def install_plan(
    found: list[tuple[int, str]], installed: set[str], count: int
) -> list[list[list[str]]]:
    """The parts to install, phase after phase: the upgrades of what is installed, in one part,
    then the new wheels dealt into ``count`` parts side by side."""
    upgrades = [item for item in found if names([item[1]]) <= installed]
    fresh = [item for item in found if item not in upgrades]
    phases = [parts_dealt(upgrades, 1), parts_dealt(fresh, count)]
    return [phase for phase in phases if phase]


def main(args: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="pip-parallel-") as tmp:
        folder = Path(tmp)
        report = folder / "report.json"
        subprocess.run(pip("install", "--dry-run", "--report", str(report), *args), check=True)
        found = wheels(json.loads(report.read_text()))
        count = min(MAX_PARTS, os.cpu_count() or 1)
        for phase in install_plan(found, installed_names(), count):
            parts_install(phase, folder)
        requested_unmark(names([spec for _, spec in found]))
    subprocess.run(pip("install", *args), check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
