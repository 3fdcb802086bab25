"""Code that runs right after a module is imported: how a script launched by Trainyard gets the
frameworks' integrations with no line of its own (trainyard.launched installs them before the
script's first line). The same idea as wrapt's post-import hooks: a finder first on sys.meta_path
that lets the usual finders find the module, then wraps its loader so that the hook runs once
the module's code has run. A module imported already gets its hook at once.

A hook that raises is reported on stderr and dropped: an observer must never break the script
it watches (TraceML's rule).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType

Hook = Callable[[ModuleType], None]


def hook_run(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception:
        print(f"trainyard: could not attach to {module.__name__}; going on without it:\n"
              f"{traceback.format_exc()}", file=sys.stderr)  # fmt: skip


class _Loader(importlib.abc.Loader):
    """The module's own loader, and the hook after its code has run."""

    def __init__(self, loader: importlib.abc.Loader, hook: Hook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        hook_run(self.hook, module)


class AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, hooks: dict[str, Hook]):
        self.hooks = hooks
        self.looking: set[str] = set()

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        hook = self.hooks.get(name)
        if hook is None or name in self.looking:
            return None
        self.looking.add(name)  # the finders below find it; this one stands aside meanwhile
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.looking.discard(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, hook)
        return spec


def hooks_install(hooks: dict[str, Hook]) -> None:
    """Run each hook after its module is imported (at once where it is already)."""
    for name, hook in hooks.items():
        if name in sys.modules:
            hook_run(hook, sys.modules[name])
    sys.meta_path.insert(0, AfterImport({n: h for n, h in hooks.items() if n not in sys.modules}))
