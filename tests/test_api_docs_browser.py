"""The API docs page in a real Chromium: reached from the nav, Swagger UI renders every
operation of /api/schema/, and nothing is fetched from anywhere but this server (no CDN)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dashboard.serving import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import need
from tests.stack import ROOT, Stack

# sqlite_only: the docs page draws the schema, which no database engine changes.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.sqlite_only,
    pytest.mark.timeout(300),
]

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture
def page(stack: Stack) -> Iterator[Any]:
    need(Path(CHROMIUM).exists() or shutil.which("chromium") is not None, "no Chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, reduced_motion="reduce")
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        browser.close()
        assert not errors, f"script errors in the page: {errors}"


def test_docs_page_from_the_nav_lists_every_operation_offline(page: Any, stack: Stack) -> None:
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc))
    page.goto(f"{stack.base_url}/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(stack.passwords["alice"])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{stack.base_url}/")
    page.get_by_role("link", name="API", exact=True).click()
    page.wait_for_url(f"{stack.base_url}/api/docs/")
    schema = stack.login("alice").get(f"{stack.base_url}/api/schema/", timeout=30).json()
    operations = sum(
        1 for item in schema["paths"].values() for method in item if method in HTTP_METHODS
    )
    page.wait_for_function(
        "n => document.querySelectorAll('.opblock').length === n", arg=operations, timeout=30000
    )
    # Both ways in are offered by the Authorize dialog.
    page.get_by_role("button", name="Authorize").first.click()
    dialog = page.locator(".auth-container")
    assert dialog.filter(has_text="BearerToken").count() == 1
    assert dialog.filter(has_text="SessionCookie").count() == 1
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "test-artifacts" / "api-docs.png"), full_page=False)
    assert hosts == {urlsplit(stack.base_url).netloc}, f"fetched from elsewhere: {hosts}"
