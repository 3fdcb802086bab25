"""The wheel's build: pyproject.toml says what it holds; this adds what a clone keeps at its root
and the dashboard serves and starts from (templates/, static/ with its vendored libraries, the
Procfile), copied into dashboard/packaged/, where an installed wheel finds them
(dashboard/paths.py). An editable install reads them from the clone instead."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACKAGED = ("templates", "static", "Procfile")


class BuildWithRootFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / "dashboard" / "packaged"
        shutil.rmtree(target, ignore_errors=True)  # nothing left from an earlier build
        target.mkdir(parents=True)
        for name in PACKAGED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, target / name)


setup(cmdclass={"build_py": BuildWithRootFiles})
