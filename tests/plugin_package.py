"""A plug-in package as pip installs one, for the tests of plug-ins: its module and its
`.dist-info` (METADATA and entry_points.txt) in a folder that goes on a path, so that
importlib.metadata finds its entry points as it finds an installed package's."""

from __future__ import annotations

import textwrap
from pathlib import Path


def plugin_package_write(
    root: Path, *, module: str, source: str, group: str, entry_points: dict[str, str]
) -> Path:
    """`module`.py holding `source` and its distribution's `.dist-info` in `root`, its entry
    points (name -> `module:attribute`) in `group` (trainyard.models, trainyard.datasets)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    name = module.replace("_", "-")
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = "".join(f"{entry} = {target}\n" for entry, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    return root
