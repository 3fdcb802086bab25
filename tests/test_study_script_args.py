"""A study of a script run (issue 32) whose axes sweep the script's own arguments: `args.<flag>`
appends `--<flag> <value>` to the base's args, a cell each value; each cell is checked as one
script launch (the permission, the code, the args' bounds), nothing stored when one is refused.
Without Celery or torchrun: the runs are queued, not run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.experiments.models import Experiment
from dashboard.experiments.scripts.code import code_store
from dashboard.experiments.scripts.launch import MAX_ARG_CHARS, MAX_ARGS
from dashboard.studies.args_axes import args_axes_read, cell_payload
from dashboard.studies.fastest import cell_values
from dashboard.studies.models import Study, StudyRun
from tests.factories import logged_in
from tests.test_code_upload import FOLDER, allowed, tar_gz

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(user_factory: Any) -> Any:
    return allowed(user_factory(username="scripter"))


@pytest.fixture
def code(settings: Any, tmp_path: Path, owner: Any) -> int:
    """An upload of the owner's holding train.py."""
    settings.TRAINYARD_CODE_DIR = tmp_path / "code"
    archive = tar_gz(FOLDER)
    return code_store(owner=owner, upload=io.BytesIO(archive), size=len(archive)).pk


@pytest.fixture
def folder(settings: Any, tmp_path: Path) -> str:
    """A folder on the workers under their script roots, holding train.py."""
    settings.TRAINYARD_SCRIPT_ROOTS = [tmp_path / "root"]
    path = tmp_path / "root" / "project"
    (path / "lib").mkdir(parents=True)
    for name, text in FOLDER.items():
        (path / name).write_text(text)
    return str(path)


def study(code: int, **change: Any) -> dict[str, Any]:
    base = {"strategy": "script", "entrypoint": "train.py", "args": ["--epochs", "2"]}
    return {
        "name": "sweep",
        "base": {**base, "code": code, **change.pop("base", {})},
        "axes": {"args.lr": [0.1, 0.01]},
        "target_accuracy": 0.9,
        **change,
    }


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(reverse("api-studies"), json.dumps(body), content_type="application/json")


def test_an_args_axis_appends_its_pair_in_the_axes_order() -> None:
    values = {"args.warmup-steps": 10, "seed": 3, "args.opt": "sgd"}
    payload = cell_payload(base={"strategy": "script", "args": ["-v"]}, values=values)
    assert payload == {
        "strategy": "script",
        "args": ["-v", "--warmup-steps", "10", "--opt", "sgd"],
        "seed": 3,
    }
    # Read back from the stored args, whatever the base's args held (a flag of the same name).
    args = ["--opt", "adam", *payload["args"]]
    assert args_axes_read(args=args, axes=values) == {"args.warmup-steps": "10", "args.opt": "sgd"}


@pytest.mark.parametrize("where", ["code", "code_path"])
def test_a_script_study_queues_a_run_per_value_with_its_args(
    owner: Any,
    code: int,
    folder: str,
    launched: list[int],
    where: str,
    django_capture_on_commit_callbacks: Any,
) -> None:
    client = logged_in(owner)
    base = {"code": None, "code_path": folder} if where == "code_path" else {}
    body = study(code, base={**base, "processes": 2}, axes={"args.lr": [0.1, 0.01], "seed": [1]})
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, body)
    assert response.status_code == 201, response.content
    created = response.json()
    runs = list(Experiment.objects.filter(pk__in=created["runs"]).order_by("pk"))
    assert sorted(launched) == created["runs"]
    assert [(e.strategy, e.entrypoint, e.processes) for e in runs] == [
        ("script", "train.py", 2)
    ] * 2
    assert [e.args for e in runs] == [
        ["--epochs", "2", "--lr", "0.1"],
        ["--epochs", "2", "--lr", "0.01"],
    ]
    stored = (code, "") if where == "code" else (None, folder)
    assert {(e.code_id, e.code_path) for e in runs} == {stored}
    assert [e.name for e in runs] == [
        "sweep · Script ×2 · args.lr 0.1 · seed 1", "sweep · Script ×2 · args.lr 0.01 · seed 1",
    ]  # fmt: skip
    assert [link.values for link in StudyRun.objects.order_by("position")] == [
        {"args.lr": 0.1, "seed": 1}, {"args.lr": 0.01, "seed": 1},
    ]  # fmt: skip
    # Read back: the base and axes as given, a cell per value, each saying its command line.
    detail = client.get(reverse("api-study", args=[created["id"]])).json()
    assert (detail["base"], detail["axes"]) == (body["base"], body["axes"])
    cells = detail["cells"]
    assert [cell["texts"]["settings"] for cell in cells] == [
        "train.py --epochs 2 --lr 0.1", "train.py --epochs 2 --lr 0.01",
    ]  # fmt: skip
    assert [cell_values(cell=cell, axes=detail["axes"]) for cell in cells] == [
        {"args.lr": "0.1"}, {"args.lr": "0.01"},
    ]  # fmt: skip
    page = client.get(reverse("study-detail", args=[created["id"]])).content.decode()
    assert "train.py --epochs 2 --lr 0.01" in page
    csv_rows = client.get(reverse("api-study-export", args=[created["id"]])).content.decode()
    assert csv_rows.splitlines()[1].endswith(",train.py,--epochs 2 --lr 0.1")


def refused(client: Client, body: dict[str, Any], field: str, words: str, status: int = 400) -> Any:
    """A refusal with the reason on its field, and nothing stored or queued."""
    response = post(client, body)
    assert response.status_code == status, response.content
    answer = response.json()
    reasons = answer.get("errors", {}).get(field, [answer["error"]])
    assert words in " ".join(reasons), answer
    assert (Study.objects.count(), Experiment.objects.count()) == (0, 0)
    return answer


@pytest.mark.parametrize(
    ("axes", "field", "words"),
    [
        ({"args.-lr": [0.1]}, "axes.args.-lr", "names no flag"),
        ({"args.": [0.1]}, "axes.args.", "names no flag"),
        ({"args.l r": [0.1]}, "axes.args.l r", "names no flag"),
        ({"args": [0.1]}, "axes.args", "not an axis"),
        ({"args.lr": [True]}, "axes.args.lr", "a number or a string"),
        ({"args.lr": [0.1, None]}, "axes.args.lr", "a number or a string"),
        ({"args.lr": [[0.1]]}, "axes.args.lr", "a number or a string"),
        ({"args.lr": [{"v": 1}]}, "axes.args.lr", "a number or a string"),
    ],
)
def test_a_bad_args_axis_is_refused_naming_it(
    owner: Any, code: int, launched: list[int], axes: dict[str, Any], field: str, words: str
) -> None:
    refused(logged_in(owner), study(code, axes=axes), field, words)
    assert launched == []


@pytest.mark.parametrize("strategy", [{"strategy": "ddp"}, {}])
def test_an_args_axis_needs_a_script_base(
    owner: Any, launched: list[int], strategy: dict[str, Any]
) -> None:
    body = {
        "name": "sweep",
        "base": strategy,
        "axes": {"args.lr": [0.1]},
        "target_accuracy": 0.9,
    }
    refused(logged_in(owner), body, "axes.args.lr", "only a script run reads arguments")


def test_without_the_permission_a_script_study_is_a_403(
    owner: Any, code: int, user_factory: Any, launched: list[int]
) -> None:
    someone = user_factory()
    # The owner's upload: the permission is asked first, as a launch asks it.
    answer = refused(logged_in(someone), study(code), "", "experiments.run_script", status=403)
    assert "cell" not in answer


@pytest.mark.parametrize(
    ("change", "field", "words", "cell"),
    [
        # 127 base args and the axis' pair: one past the bound.
        (
            {"base": {"args": ["-x"] * (MAX_ARGS - 1)}},
            "args",
            f"at most {MAX_ARGS} arguments",
            1,
        ),
        (
            {"axes": {"args.lr": [0.1, "9" * (MAX_ARG_CHARS + 1)]}},
            "args",
            f"at most {MAX_ARG_CHARS} characters",
            2,
        ),
        ({"base": {"entrypoint": "missing.py"}}, "entrypoint", "missing.py is not a file", 1),
        ({"base": {"lr": 0.5}}, "lr", "does not read it", 1),
        ({"batch_mode": "global"}, "batch_mode", "reads no batch size", 1),
    ],
)
def test_a_cell_that_is_no_valid_script_launch_refuses_the_study(
    owner: Any,
    code: int,
    launched: list[int],
    change: dict[str, Any],
    field: str,
    words: str,
    cell: int,
) -> None:
    answer = refused(logged_in(owner), study(code, **change), field, words)
    assert answer["cell"]["index"] == cell
    assert launched == []


def test_an_args_axis_is_read_back_by_its_flag_whatever_order_the_axes_come_in() -> None:
    """PostgreSQL's jsonb gives a study's axes back in its own key order, not the request's."""
    from dashboard.studies.args_axes import args_axes_read

    args = ["--epochs", "2", "--lr", "0.5", "--lr", "0.1", "--momentum", "0.9"]
    for axes in (["args.lr", "args.momentum"], ["args.momentum", "args.lr", "seed"]):
        assert args_axes_read(args=args, axes=axes) == {"args.lr": "0.1", "args.momentum": "0.9"}
