"""A script run launched from the launch page (issue 32, item 6): offered only to users allowed
to run scripts; its code an upload (the page's script sends it to POST /api/code/ first and
posts the id) or a folder under the script roots; its arguments one line split as a shell
splits it; each refusal on its field, nothing stored; the engine's hidden fields stored at
their defaults; "Run again" fills the page with what the run ran. The page's own script (packing
a folder in the browser) is driven in Chromium by tests/test_browser.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dashboard.experiments.models import Experiment
from dashboard.experiments.templatetags.page_facts import page_facts_build
from tests import test_script_launch
from tests.factories import form_data, logged_in
from tests.test_code_upload import FOLDER, allowed, tar_gz
from tests.test_script_launch import stored

pytestmark = pytest.mark.django_db

# The script roots and the allowed user, as the API's tests have them (fixtures by these names).
script_dirs = test_script_launch.dirs
scripter = test_script_launch.owner

NEW = "/experiments/new/"


def script_post(**fields: Any) -> dict[str, str]:
    """The page's post for a script run: the engine's fields as the browser still sends them
    (hidden, left from another strategy), the script's besides."""
    data = {"entrypoint": "train.py", "args": "--epochs 2", "code": "", "code_path": ""}
    data.update({key: str(value) for key, value in fields.items()})
    return form_data(strategy="script", processes=2, **data)


def errors_of(response: Any) -> dict[str, list[str]]:
    return {key: list(value) for key, value in response.context["script_form"].errors.items()}


def test_only_a_user_allowed_to_run_scripts_is_offered_one(
    user_factory: Any, scripter: Any, script_dirs: Path
) -> None:
    plain = logged_in(user_factory(username="plain"))
    page = plain.get(NEW).content.decode()
    assert '<option value="ddp"' in page and '<option value="script"' not in page
    assert 'id="script-fields"' not in page and "script_upload.js" not in page
    response = plain.post(NEW, script_post(code_path=str(script_dirs / "root" / "project")))
    assert response.status_code == 400 and "strategy" in response.context["form"].errors
    assert not Experiment.objects.exists()

    page = logged_in(scripter).get(NEW).content.decode()
    assert '<option value="script"' in page and '<li data-strategy="script"' in page
    assert 'id="script-fields"' in page and "script_upload.js" in page
    # The upload's route and bounds, for the page's script; the folders under the roots.
    assert 'data-upload-url="/api/code/"' in page
    assert f'<option value="{script_dirs / "root" / "project"}">' in page
    facts = page_facts_build()["strategies"]
    assert facts["script"]["user_script"] and not facts["ddp"]["user_script"]


def test_an_uploaded_folder_launches_with_its_arguments_split_as_a_shell_would(
    scripter: Any, script_dirs: Path, launched: list[int]
) -> None:
    code = stored(scripter, tar_gz(FOLDER))
    post = script_post(code=code.pk, args="--epochs 2 --note 'two words'", epochs=7, lr=0.5)
    response = logged_in(scripter).post(NEW, {**post, "model": "resnet18", "dataset": "fashion"})
    assert response.status_code == 302, errors_of(response)
    run = Experiment.objects.get()
    assert response["Location"] == run.get_absolute_url()
    assert (run.strategy, run.entrypoint, run.code_id, run.code_path) == (
        "script",
        "train.py",
        code.pk,
        "",
    )
    assert run.args == ["--epochs", "2", "--note", "two words"]
    assert (run.name, run.processes, run.nodes) == ("train.py", 2, 1)
    # What the page hid (left from another strategy) is stored at the defaults, not refused.
    assert (run.model, run.dataset, run.epochs, run.lr) == ("simple-cnn", "mnist", 1, 1e-3)


def test_a_folder_on_the_workers_launches_in_place(
    scripter: Any, script_dirs: Path, launched: list[int]
) -> None:
    folder = script_dirs / "root" / "project"
    post = script_post(code_path=f" {folder} ", entrypoint="lib/model.py", args="", name="mine")
    response = logged_in(scripter).post(NEW, post)
    assert response.status_code == 302, errors_of(response)
    run = Experiment.objects.get()
    assert (run.code_id, run.code_path, run.entrypoint, run.args, run.name) == (
        None,
        str(folder),
        "lib/model.py",
        [],
        "mine",
    )


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"entrypoint": "missing.py"}, "entrypoint", "missing.py is not a file in code"),
        ({"entrypoint": "../x.py"}, "entrypoint", "without '..'"),
        ({"args": "--note 'unclosed"}, "args", "cannot split it as a shell would"),
        ({"args": " ".join(["-x"] * 129)}, "args", "at most 128 arguments"),
        ({"code": ""}, "code", "give exactly one of code"),
        ({"code_path": "/etc"}, "code", "give exactly one of code"),  # and an upload: both
        ({"code": "", "code_path": "/etc"}, "code_path", "is not under the script roots"),
        ({"code": "999999"}, "code", "no such code 999999"),
    ],
)
def test_a_refusal_is_said_on_its_field_and_nothing_is_stored(
    scripter: Any,
    script_dirs: Path,
    launched: list[int],
    fields: dict[str, str],
    field: str,
    words: str,
) -> None:
    code = stored(scripter, tar_gz(FOLDER))
    response = logged_in(scripter).post(NEW, script_post(**{"code": code.pk, **fields}))
    assert response.status_code == 400
    reasons = errors_of(response).get(field, [])
    assert any(words in reason for reason in reasons), errors_of(response)
    page = response.content.decode()
    assert 'id="form-errors"' in page and "field-error" in page
    assert not Experiment.objects.exists() and not launched


def test_another_users_upload_is_no_such_code(
    scripter: Any, user_factory: Any, script_dirs: Path, launched: list[int]
) -> None:
    theirs = stored(allowed(user_factory(username="bob")), tar_gz(FOLDER))
    response = logged_in(scripter).post(NEW, script_post(code=theirs.pk))
    assert response.status_code == 400 and "code" in errors_of(response)
    assert not Experiment.objects.exists()


def test_another_strategy_ignores_the_hidden_script_fields(
    scripter: Any, script_dirs: Path, launched: list[int]
) -> None:
    data = {**form_data(strategy="ddp", processes=2), "entrypoint": "x.py", "args": "--lr 1"}
    response = logged_in(scripter).post(NEW, {**data, "code": "", "code_path": ""})
    assert response.status_code == 302
    run = Experiment.objects.get()
    assert (run.strategy, run.entrypoint, run.args, run.code_id) == ("ddp", "", [], None)


def test_run_again_fills_the_page_with_what_the_script_ran(
    scripter: Any, script_dirs: Path, launched: list[int]
) -> None:
    client = logged_in(scripter)
    code = stored(scripter, tar_gz(FOLDER))
    client.post(NEW, script_post(code=code.pk, args="--note 'two words'"))
    run = Experiment.objects.get()
    page = client.get(run.get_absolute_url()).content.decode()
    assert f'href="/experiments/new/?clone={run.pk}" id="clone-link"' in page
    form = client.get(f"{NEW}?clone={run.pk}").content.decode()
    assert re.search(rf'name="code" value="{code.pk}"', form)
    assert 'value="--note &#x27;two words&#x27;"' in form
    assert 'name="entrypoint" value="train.py"' in form
    assert '<option value="script" selected>' in form
    assert f"Code {code.sha256[:12]}" in form
    again = client.post(
        NEW, {**script_post(code=code.pk, args="--note 'two words'"), "clone": run.pk}
    )
    assert again.status_code == 302
    copy = Experiment.objects.exclude(pk=run.pk).get()
    assert (copy.cloned_from_id, copy.args, copy.code_id) == (run.pk, run.args, code.pk)
    # Its scripter, no longer allowed to run scripts, is not offered to run it again.
    scripter.user_permissions.clear()
    assert 'id="clone-link"' not in client.get(run.get_absolute_url()).content.decode()
