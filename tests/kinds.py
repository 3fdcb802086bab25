"""The slow kinds of test, marked by what a test uses instead of by hand in every file, so that a
new test that asks for the stack, a browser page or test machines is left out of `make test-fast`
by itself (tests/conftest.py's collection hook calls `kinds_mark`; the markers are declared in
pyproject.toml)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

# The stack's fixture (its own Redis, daphne, Celery worker and beat); fixtures built on it (a
# module's extra workers) are in a test's fixture closure too.
STACK_FIXTURES = frozenset({"stack"})
# A Playwright page, or pytest-django's live server that a page is pointed at.
BROWSER_FIXTURES = frozenset({"page", "live_server"})
# Network namespaces: whatever comes from these modules makes test machines.
MACHINE_MODULES = frozenset({"tests.netns", "tests.machines_cluster"})


def _home(value: object) -> str | None:
    """The module an imported name comes from."""
    return value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)


def _calls_machines(function: Any) -> bool:
    code = getattr(function, "__code__", None)
    if code is None:
        return False
    names = function.__globals__
    return any(_home(names.get(name)) in MACHINE_MODULES for name in code.co_names)


def makes_machines(item: pytest.Item) -> bool:
    """Whether the test, or a fixture it uses, calls into tests/netns.py (directly or through a
    cluster of tests/machines_cluster.py): a module's other tests may be quick ones."""
    if _calls_machines(getattr(item, "function", None)):
        return True
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(_calls_machines(d.func) for defs in definitions.values() for d in defs)


def _fixtures(item: pytest.Item) -> frozenset[str]:
    """The fixtures a test uses; a parametrized argument of the same name (`page` of the pages'
    tests) is not one."""
    callspec = getattr(item, "callspec", None)
    params = set(callspec.params) if callspec is not None else set()
    return frozenset(getattr(item, "fixturenames", ())) - params


def kinds_mark(item: pytest.Item) -> None:
    names = _fixtures(item)
    if not STACK_FIXTURES.isdisjoint(names):
        item.add_marker(pytest.mark.stack)
    if not BROWSER_FIXTURES.isdisjoint(names):
        item.add_marker(pytest.mark.browser)
    if makes_machines(item):
        item.add_marker(pytest.mark.machines)
