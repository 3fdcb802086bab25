"""The launch page's script upload in real Chromium, against Django's live server: a folder
picked is packed by the page (ustar + gzip, static/js/script_upload.js) and uploaded to
POST /api/code/; the server's own unpacking checks find exactly the folder's files, less version
control and caches; a refused launch keeps the upload; the run launches with the arguments
split as a shell would. The run itself, through Celery and torchrun, is test_script_stack.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from dashboard.experiments.models import CodeArchive, Experiment
from dashboard.experiments.scripts.code import code_files
from tests.docs_screenshots import docs_screenshot
from tests.live_browser import live_page
from tests.stack import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = ROOT / "test-artifacts"

# Past ustar's 100-byte name: the page must cut it into the header's prefix.
DEEP = "src/" + "/".join(["a_rather_long_package_name"] * 4) + "/model_definitions.py"
FILES = {
    "train.py": "import trainyard\nprint('training')\n",
    "lib/model.py": "import torch\n",
    "données/lisez-moi.txt": "é" * 700,  # UTF-8 names, a body over one 512-byte block
    DEEP: "x = 1\n",
    "empty.py": "",
}
LEFT_OUT = {
    ".git/config": "[core]\n", "lib/__pycache__/model.cpython-311.pyc": "\0", "a.pyc": "",
    ".env": "SECRET=1\n", "lib/.env.local": "TOKEN=2\n",
}  # fmt: skip


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for name, text in {**FILES, **LEFT_OUT}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def page(
    live_server: Any, user_factory: Any, settings: Any, tmp_path: Path, monkeypatch: Any
) -> Iterator[Any]:
    settings.TRAINYARD_CODE_DIR = tmp_path / "code"
    user = user_factory(username="scripter")
    user.user_permissions.add(Permission.objects.get(codename="run_script"))
    with live_page(live_server, user, monkeypatch, viewport={"width": 1280, "height": 900}) as page:
        page.user = user
        yield page


@pytest.mark.docs_screenshots
def test_a_folder_packed_by_the_page_is_the_code_the_run_launches_with(
    page: Any, live_server: Any, folder: Path, launched: list[int]
) -> None:
    page.goto(f"{live_server.url}/experiments/new/")
    assert page.get_by_label("Epochs").is_visible()
    page.get_by_label("Strategy").select_option("script")
    # The engine's model, data and training fields give way to the script's.
    assert not page.get_by_label("Epochs").is_visible()
    assert not page.get_by_label("Model").is_visible()
    page.locator("#code-folder").set_input_files(str(folder))
    page.wait_for_function(
        "() => /^(Uploaded|Not uploaded)/.test(document.getElementById('code-status').textContent)"
    )
    status = page.locator("#code-status").inner_text()
    assert status.startswith("Uploaded code"), status
    [archive] = CodeArchive.objects.all()
    assert archive.owner_id == page.user.pk and f"{len(FILES)} files" in status
    # What the server unpacked, through its own checks, is the folder less what is left out.
    assert set(code_files(code=archive)) == set(FILES)
    assert page.locator("#id_code").input_value() == str(archive.pk)
    offered = page.locator("#script-entrypoints option").evaluate_all("o => o.map(x => x.value)")
    assert set(offered) == {name for name in FILES if name.endswith(".py")}
    docs_screenshot(page, "script-form", at="#field-strategy")

    # Refused (no such entry point): said on its field, the upload kept, not asked again.
    page.get_by_label("Entry point").fill("missing.py")
    page.get_by_role("button", name="Start run").click()
    page.wait_for_selector("#field-entrypoint .field-error")
    assert "missing.py is not a file in code" in page.locator("#field-entrypoint").inner_text()
    assert page.locator("#id_code").input_value() == str(archive.pk)
    assert archive.sha256[:12] in page.locator("#code-status").inner_text()
    assert not Experiment.objects.exists()

    page.get_by_label("Entry point").fill("train.py")
    page.get_by_label("Arguments").fill("--epochs 2 --note 'two words'")
    page.get_by_label("Processes").fill("2")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "script-form.png"), full_page=True)
    page.get_by_role("button", name="Start run").click()
    page.wait_for_url("**/experiments/*/")
    run = Experiment.objects.get()
    assert (run.strategy, run.code_id, run.entrypoint, run.processes) == (
        "script", archive.pk, "train.py", 2,
    )  # fmt: skip
    assert run.args == ["--epochs", "2", "--note", "two words"]
    assert "sha256 " + archive.sha256 in page.content()
