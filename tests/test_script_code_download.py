"""A script run's upload back as a download (GET /experiments/<id>/code/, issue 32): the archive's
bytes as uploaded, .tar.gz or .zip, for its owner and staff only (a 404 for others, as for
checkpoints); a plain-text 404 where the run has no upload or its file is gone. The run page links
it and shows the packages the script ran with."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from dashboard.experiments.models import Experiment
from tests.factories import api_post, logged_in
from tests.test_code_upload import FOLDER, allowed, tar_gz, zipped

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(user_factory: Any, settings: Any, tmp_path: Path) -> Any:
    settings.TRAINYARD_CODE_DIR = tmp_path / "code"
    settings.TRAINYARD_SCRIPT_ROOTS = [tmp_path]
    return allowed(user_factory(username="scripter"))


def uploaded_run(client: Client, archive: bytes, name: str) -> tuple[Experiment, dict[str, Any]]:
    """An upload through POST /api/code/, then a script run of it."""
    upload = client.post("/api/code/", {"archive": SimpleUploadedFile(name, archive)})
    assert upload.status_code == 201, upload.content
    code = upload.json()
    body = {"strategy": "script", "entrypoint": "train.py", "code": code["id"]}
    launched = api_post(client, body)
    assert launched.status_code == 201, launched.content
    return Experiment.objects.get(pk=launched.json()["id"]), code


def url(run: Experiment) -> str:
    return f"/experiments/{run.pk}/code/"


@pytest.mark.parametrize(
    ("pack", "kind", "content_type"),
    [(tar_gz, "tar.gz", "application/gzip"), (zipped, "zip", "application/zip")],
)
def test_the_owner_downloads_the_bytes_uploaded_and_the_page_links_them(
    owner: Any, launched: list[int], pack: Callable[..., bytes], kind: str, content_type: str
) -> None:
    client = logged_in(owner)
    archive = pack(FOLDER)
    run, code = uploaded_run(client, archive, f"mine.{kind}")
    response = client.get(url(run))
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == code["sha256"] == hashlib.sha256(archive).hexdigest()
    name = f"run-{run.pk}-code-{code['sha256'][:12]}.{kind}"
    assert response["Content-Disposition"] == f'attachment; filename="{name}"'
    assert response["Content-Type"] == content_type
    page = client.get(run.get_absolute_url()).content.decode()
    assert f'href="{url(run)}" id="code-download" download>Download the code</a>' in page
    assert f"<dd>sha256 {code['sha256']}</dd>" in page


def test_only_the_owner_and_staff_get_it(
    owner: Any, user_factory: Any, launched: list[int]
) -> None:
    run, _ = uploaded_run(logged_in(owner), tar_gz(FOLDER), "mine.tar.gz")
    stranger = logged_in(allowed(user_factory()))  # may run scripts, not this one's
    refused = stranger.get(url(run))
    assert refused.status_code == 404 and b"train.py" not in refused.content
    assert stranger.get(url(run)).content == stranger.get("/experiments/999999/code/").content
    assert logged_in(user_factory(staff=True)).get(url(run)).status_code == 200
    anonymous = Client().get(url(run))
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]


def test_a_run_without_an_upload_or_its_file_says_why_in_plain_text(
    owner: Any, tmp_path: Path, launched: list[int], experiment_factory: Any, settings: Any
) -> None:
    client = logged_in(owner)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(FOLDER["train.py"])
    body = {"strategy": "script", "entrypoint": "train.py", "code_path": str(folder)}
    of_folder = Experiment.objects.get(pk=api_post(client, body).json()["id"])
    response = client.get(url(of_folder))
    assert response.status_code == 404
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response.content.decode() == (
        f"Run {of_folder.pk} has no uploaded code to download: it ran the folder {folder} "
        "on its workers."
    )
    assert 'id="code-download"' not in client.get(of_folder.get_absolute_url()).content.decode()
    engine = experiment_factory(owner=owner)
    assert client.get(url(engine)).content.decode() == (
        f"Run {engine.pk} has no uploaded code to download."
    )

    run, code = uploaded_run(client, tar_gz(FOLDER), "mine.tar.gz")
    kept = Path(settings.TRAINYARD_CODE_DIR) / f"{code['sha256']}.tar.gz"
    kept.unlink()
    gone = client.get(url(run))
    assert gone.status_code == 404 and f"is not at {kept} on this machine" in gone.content.decode()


def test_the_run_page_lists_the_packages_the_script_ran_with(
    owner: Any, launched: list[int]
) -> None:
    client = logged_in(owner)
    run, _ = uploaded_run(client, tar_gz(FOLDER), "mine.tar.gz")
    assert 'id="info-packages"' not in client.get(run.get_absolute_url()).content.decode()
    # As the sink stores a script's `started` event (protocol 1.11's ScriptInfo).
    packages = ["numpy==2.3.1", "torch==2.14.1"]
    script = {"entrypoint": "train.py", "args": [], "code_dir": "/x", "stop_grace": 60.0}
    Experiment.objects.filter(pk=run.pk).update(
        run_info={"world_size": 2, "script": {**script, "packages": packages}}
    )
    page = client.get(run.get_absolute_url()).content.decode()
    assert (
        '<details class="packages" id="info-packages"><summary>2 in its interpreter (pip freeze)'
        "</summary><ul><li>numpy==2.3.1</li><li>torch==2.14.1</li></ul></details>"
    ) in page
