"""The docs' pictures (docs/images/<name>.png), taken by the browser tests of the pages they show,
so that they stay true: a test calls `docs_screenshot(page, name)` where its page looks as the
docs describe it, and marks itself `docs_screenshots`. Only under `make screenshots`
(TRAINYARD_DOCS_SCREENSHOTS=1), so that an ordinary test run leaves the committed files alone.
tests/test_docs.py checks that every picture the docs show is one of these."""

from __future__ import annotations

import os
from typing import Any

from tests.stack import ROOT

DOCS_IMAGES = ROOT / "docs" / "images"


def docs_screenshot(page: Any, name: str, *, at: str | None = None) -> None:
    """The page as it shows now into docs/images/<name>.png, when pictures are asked for: its
    viewport (what a reader sees first), or from the element `at` (a selector) down."""
    if os.environ.get("TRAINYARD_DOCS_SCREENSHOTS") != "1":
        return
    if at is not None:  # to the top, less the nav bar that stays there
        page.locator(at).first.evaluate(
            "node => window.scrollTo(0, node.getBoundingClientRect().top + window.scrollY - 72)"
        )
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS_IMAGES / f"{name}.png"))
