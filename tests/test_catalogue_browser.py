"""The launch form's model and data fields in a real Chromium (against Django's live server, no
stack): the image folder shows for imagefolder only, and each choice says what it is, from the
facts the server sent (static/js/experiment_form.js keeps no list)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from dashboard.serving import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import need
from tests.test_catalogue_launch import PETS, catalogue_report, machine

# sqlite_only: the form's catalogue comes from the workers' reports, read alike on either engine.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.sqlite_only,
]


@pytest.fixture
def page(live_server: Any, user_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    need(Path(CHROMIUM).exists() or shutil.which("chromium") is not None, "no Chromium")
    # Playwright's sync API runs an event loop in this thread, which Django's ORM then refuses.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    client = Client()
    client.force_login(user_factory(username="alice"))
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(reduced_motion="reduce")  # tests/test_browser.py's page
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}]
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        browser.close()
    assert not errors, f"script errors in the page: {errors}"


def test_the_image_folder_shows_for_imagefolder_and_choices_are_explained(
    page: Any, live_server: Any
) -> None:
    machine("host-a", catalogue_report())
    page.goto(f"{live_server.url}/experiments/new/")
    folder = page.locator("#field-data_path")
    assert folder.is_hidden()
    page.select_option("select[name=model]", "resnet18")
    assert "torchvision: A torchvision classifier" in page.text_content("#model-explain")
    page.select_option("select[name=dataset]", "imagefolder")
    assert folder.is_visible()
    page.select_option("select[name=data_path]", PETS)
    assert "3 classes, 30 images" in page.text_content("#dataset-explain")
    page.select_option("select[name=dataset]", "mnist")
    assert folder.is_hidden()
