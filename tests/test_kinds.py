"""The slow kinds are marked by what a test uses (tests/kinds.py), so that `make test-fast` leaves
out a new stack, browser or machines test by itself."""

from __future__ import annotations

import pytest

from tests.netns import machines


@pytest.fixture
def stack() -> None:
    """Only the name of the stack's fixture: marking reads names, so nothing is started here."""


@pytest.fixture
def page() -> None:
    """Only the name of a browser page's fixture."""


def test_using_the_stack_is_marked_stack(request: pytest.FixtureRequest, stack: None) -> None:
    assert request.node.get_closest_marker("stack") is not None


def test_a_test_with_a_page_is_marked_browser(request: pytest.FixtureRequest, page: None) -> None:
    assert request.node.get_closest_marker("browser") is not None


def test_a_test_calling_into_netns_is_marked_machines(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("machines") is not None
    assert callable(machines)  # named, never called: no namespace is made


@pytest.mark.parametrize("page", ["list"])
def test_a_parameter_named_page_is_no_browser(request: pytest.FixtureRequest, page: str) -> None:
    node = request.node
    assert [node.get_closest_marker(k) for k in ("browser", "stack", "machines")] == [None] * 3
