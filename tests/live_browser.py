"""A real Chromium logged in to Django's live server as one user (no stack): the browser tests
of single pages share it. Script errors in the page fail the test that opened it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from dashboard.serving import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import need


@contextlib.contextmanager
def live_page(
    live_server: Any, user: Any, monkeypatch: pytest.MonkeyPatch, **context: Any
) -> Iterator[Any]:
    """A page of a new browser context (`context`: Playwright's options) with `user`'s session."""
    need(Path(CHROMIUM).exists() or shutil.which("chromium") is not None, "no Chromium")
    # Playwright's sync API runs an event loop in this thread, which Django's ORM then refuses.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        opened = browser.new_context(**context)
        opened.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}]
        )
        page = opened.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        browser.close()
    assert not errors, f"script errors in the page: {errors}"
