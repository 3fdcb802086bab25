"""The launch form's model and data fields in a real Chromium (against Django's live server, no
stack): the image folder shows for imagefolder only, and each choice says what it is, from the
facts the server sent (static/js/experiment_form.js keeps no list)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.docs_screenshots import docs_screenshot
from tests.live_browser import live_page
from tests.test_catalogue_launch import PETS, catalogue_report, machine

# sqlite_only: the form's catalogue comes from the workers' reports, read alike on either engine.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.sqlite_only,
]


@pytest.fixture
def page(live_server: Any, user_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Reduced motion: tests/test_browser.py's page.
    user = user_factory(username="alice")
    with live_page(live_server, user, monkeypatch, reduced_motion="reduce") as page:
        yield page


@pytest.mark.docs_screenshots
def test_the_image_folder_shows_for_imagefolder_and_choices_are_explained(
    page: Any, live_server: Any
) -> None:
    machine("host-a", catalogue_report(models=("simple-cnn", "byte-llama", "resnet18")))
    page.goto(f"{live_server.url}/experiments/new/")
    folder = page.locator("#field-data_path")
    assert folder.is_hidden()
    page.select_option("select[name=model]", "resnet18")
    assert "torchvision: A torchvision classifier" in page.text_content("#model-explain")
    # Each built-in model says what it is, not the other's line.
    page.select_option("select[name=model]", "byte-llama")
    assert "language model over bytes" in page.text_content("#model-explain")
    page.select_option("select[name=model]", "simple-cnn")
    assert "small CNN for 28x28" in page.text_content("#model-explain")
    page.select_option("select[name=model]", "resnet18")
    page.select_option("select[name=dataset]", "imagefolder")
    assert folder.is_visible()
    page.select_option("select[name=data_path]", PETS)
    assert "3 classes, 30 images" in page.text_content("#dataset-explain")
    docs_screenshot(page, "new-run-form")
    page.select_option("select[name=dataset]", "mnist")
    assert folder.is_hidden()
