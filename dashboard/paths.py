"""Where Trainyard's files are, in a clone or in an installed wheel.

A clone keeps the files the dashboard serves and starts from (templates/, static/, the Procfile)
at its root, and its data (the SQLite file, runs, checkpoints, code) in var/: what `make run`
has always used. The wheel carries the same files inside the package, in dashboard/packaged/
(setup.py copies them there when it builds), and keeps its data in the user's data folder, since
site-packages is no place to write. TRAINYARD_HOME, read by the settings, overrides either.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGED_DIR = PACKAGE_DIR / "packaged"
# Only a built wheel has the copied files: a clone (and its editable install) never does.
INSTALLED = PACKAGED_DIR.is_dir()
# The folder that holds templates/, static/ and the Procfile.
SOURCE_DIR = PACKAGED_DIR if INSTALLED else PACKAGE_DIR.parent


def user_data_dir() -> Path:
    """Trainyard's folder in the user's data folder, where platformdirs would put it: the XDG
    data home (~/.local/share) on Linux, Application Support on macOS."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "trainyard"
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # The XDG spec ignores a relative value, as platformdirs does.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "trainyard"


def home_default() -> Path:
    """TRAINYARD_HOME when the environment does not name one."""
    return user_data_dir() if INSTALLED else PACKAGE_DIR.parent / "var"
