"""A script run (strategy "script", issue 32), the dashboard's side, without Celery or torchrun:
the launch by the API (its code an upload of the requester's or a folder under the script
roots, its entry point a file of it, its arguments strings) and every refusal, with nothing
stored; the read JSON; the worker's command (the attempt's code unpacked afresh, the script's
arguments last, after "--"); the sink storing a script's `metrics` events within bounds. The
launch page's script fields are tests/test_script_form.py's."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest
from django.db.models import RestrictedError
from django.test import Client

from dashboard.experiments.models import Checkpoint, CodeArchive, Experiment, SeriesPoint, Status
from dashboard.experiments.runs import runner
from dashboard.experiments.runs.attempts import checkpoint_latest
from dashboard.experiments.runs.relay import EventRelay
from dashboard.experiments.runs.runner import RunSupervisor, training_command
from dashboard.experiments.runs.sink import MAX_METRICS_VALUES, MAX_RANKS, EventSink
from dashboard.experiments.runs.state import AttemptState
from dashboard.experiments.scripts.code import code_store
from dashboard.experiments.scripts.launch import MAX_ARG_CHARS, MAX_ARGS
from dashboard.experiments.services import experiment_clone
from dashboard.experiments.templatetags.page_facts import page_facts_build
from dashboard.experiments.web.api_launch import LaunchIn
from tests.factories import api_post, logged_in
from tests.test_code_upload import FOLDER, allowed, tar_gz, zipped
from training.registry import REGISTRY
from training.strategies import strategy_module

pytestmark = pytest.mark.django_db


@pytest.fixture
def dirs(settings: Any, tmp_path: Path) -> Path:
    """The code and runs folders, and one script root holding a folder of code."""
    settings.TRAINYARD_CODE_DIR = tmp_path / "code"
    settings.TRAINYARD_RUNS_DIR = tmp_path / "runs"
    settings.TRAINYARD_SCRIPT_ROOTS = [tmp_path / "root"]
    folder = tmp_path / "root" / "project"
    (folder / "lib").mkdir(parents=True)
    for name, text in FOLDER.items():
        (folder / name).write_text(text)
    (tmp_path / "outside.py").write_text("print('not in the root')\n")
    (folder / "out.py").symlink_to(tmp_path / "outside.py")
    return tmp_path


@pytest.fixture
def owner(user_factory: Any) -> Any:
    return allowed(user_factory(username="scripter"))


def stored(owner: Any, archive: bytes) -> CodeArchive:
    return code_store(owner=owner, upload=io.BytesIO(archive), size=len(archive))


def script_body(**fields: Any) -> dict[str, Any]:
    return {"strategy": "script", "entrypoint": "train.py", "args": ["--epochs", "2"], **fields}


def refused(
    client: Client, body: dict[str, Any], field: str, words: str, status: int = 400
) -> None:
    """A refusal with the reason on its field, and nothing stored."""
    response = api_post(client, body)
    assert response.status_code == status, response.content
    reasons = response.json().get("errors", {}).get(field, [response.json()["error"]])
    assert words in " ".join(reasons), reasons
    assert not Experiment.objects.exists()


# --- a good launch, read back ------------------------------------------------------------------


def test_a_script_run_of_an_upload_launches_and_reads_back_what_ran(
    owner: Any, dirs: Path, launched: list[int]
) -> None:
    client = logged_in(owner)
    code = stored(owner, tar_gz(FOLDER))
    response = api_post(client, script_body(entrypoint="./train.py", code=code.pk, processes=2))
    assert response.status_code == 201, response.content
    body = response.json()
    assert {key: body[key] for key in ("entrypoint", "args", "code", "code_path")} == {
        "entrypoint": "train.py",  # normalised
        "args": ["--epochs", "2"],
        "code": code.pk,
        "code_path": None,
    }
    assert body["code_sha256"] == code.sha256 and body["strategy"] == "script"
    assert (body["name"], body["processes"], body["nodes"]) == ("train.py", 2, 1)
    assert client.get(f"/api/experiments/{body['id']}/").json() == body
    [listed] = client.get("/api/experiments/").json()["experiments"]
    assert listed["code_sha256"] == code.sha256 and listed["args"] == ["--epochs", "2"]
    run = Experiment.objects.get(pk=body["id"])
    # The engine's settings stay at their defaults: the script has its own.
    assert (run.model, run.dataset, run.epochs, run.lr) == ("simple-cnn", "mnist", 1, 1e-3)
    # The run page says what ran in place of the engine's settings, and offers to run it again.
    page = client.get(run.get_absolute_url()).content.decode()
    assert "<dt>Entry point</dt><dd>train.py</dd>" in page
    assert "<dt>Arguments</dt><dd>--epochs 2</dd>" in page
    assert f"<dd>sha256 {code.sha256}</dd>" in page and 'id="param-model"' not in page
    assert 'id="clone-link"' in page


def test_a_script_run_of_a_folder_under_the_script_roots(
    owner: Any, dirs: Path, launched: list[int]
) -> None:
    folder = dirs / "root" / "project"
    body = script_body(code_path=str(folder), entrypoint="lib/model.py", args=[], name="mine")
    response = api_post(logged_in(owner), body)
    assert response.status_code == 201, response.content
    read = response.json()
    assert (read["code"], read["code_sha256"], read["code_path"]) == (None, None, str(folder))
    assert (read["entrypoint"], read["args"], read["name"]) == ("lib/model.py", [], "mine")


def test_another_strategy_reads_null_script_fields(api: Client, launched: list[int]) -> None:
    body = api_post(api, {"strategy": "ddp"}).json()
    assert [body[key] for key in ("entrypoint", "args", "code", "code_path", "code_sha256")] == [
        None, [], None, None, None,
    ]  # fmt: skip


# --- refusals: 403 and 400, nothing stored -----------------------------------------------------


def test_without_the_permission_a_script_run_is_a_403(user_factory: Any, dirs: Path) -> None:
    someone = user_factory()
    code = stored(someone, tar_gz(FOLDER))  # stored by the service: the API would refuse it too
    client = logged_in(someone)
    refused(client, script_body(code=code.pk), "", "experiments.run_script", status=403)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"entrypoint": None}, "entrypoint", "give the script's file"),
        ({"entrypoint": ""}, "entrypoint", "give the script's file"),
        ({"entrypoint": "/srv/train.py"}, "entrypoint", "relative to the code folder"),
        ({"entrypoint": "../train.py"}, "entrypoint", "without '..'"),
        ({"entrypoint": "lib/../train.py"}, "entrypoint", "without '..'"),
        ({"entrypoint": "eval.py"}, "entrypoint", "eval.py is not a file in code"),
        ({"entrypoint": "lib"}, "entrypoint", "lib is not a file in code"),
        ({"entrypoint": 3}, "entrypoint", "must be a string"),
        ({"args": "--epochs 2"}, "args", "must be a list"),
        ({"args": ["--epochs", 2]}, "args", "a list of strings"),
        ({"args": ["-x"] * (MAX_ARGS + 1)}, "args", f"at most {MAX_ARGS} arguments"),
        ({"args": ["x" * (MAX_ARG_CHARS + 1)]}, "args", f"at most {MAX_ARG_CHARS} characters"),
        ({"args": ["a\0b"]}, "args", "NUL"),
        ({"code": None}, "code", "not neither"),
        ({"code_path": "/srv"}, "code", "not both"),
        ({"code": 999_999}, "code", "no such code 999999"),
        ({"code": "1"}, "code", "must be an integer"),
        ({"epochs": 5}, "epochs", "does not read it"),
        ({"dataset": "fashion-mnist"}, "dataset", "does not read it"),
        ({"zero_stage": 2}, "zero_stage", "not script"),
    ],
)
def test_a_script_run_is_refused_with_the_reason_on_its_field(
    owner: Any, dirs: Path, fields: dict[str, Any], field: str, words: str
) -> None:
    code = stored(owner, zipped(FOLDER))  # a zip's member names are read as a tar's
    refused(logged_in(owner), script_body(code=code.pk) | fields, field, words)


def test_another_users_code_is_no_such_code(owner: Any, user_factory: Any, dirs: Path) -> None:
    theirs = stored(allowed(user_factory()), tar_gz(FOLDER))
    refused(logged_in(owner), script_body(code=theirs.pk), "code", f"no such code {theirs.pk}")


@pytest.mark.parametrize(
    ("code_path", "entrypoint", "field", "words"),
    [
        ("root/project", "train.py", "code_path", "an absolute folder"),
        ("{tmp}/root/../root/project", "train.py", "code_path", "without '..'"),
        ("{tmp}", "outside.py", "code_path", "is not under the script roots ({tmp}/root)"),
        ("{tmp}/root/nothing", "train.py", "code_path", "no folder"),
        ("{tmp}/root/" + "x" * 300, "train.py", "code_path", "no folder"),
        ("{tmp}/root/a\0b", "train.py", "code_path", "NUL"),
        ("{tmp}/root/project", "y" * 300, "entrypoint", "is not a file in"),
        ("{tmp}/root/project", "eval.py", "entrypoint", "eval.py is not a file in"),
        ("{tmp}/root/project", "out.py", "entrypoint", "out.py is not a file in"),  # a link out
    ],
)
def test_a_folder_must_be_under_the_script_roots_and_hold_the_entry_point(
    owner: Any, dirs: Path, code_path: str, entrypoint: str, field: str, words: str
) -> None:
    body = script_body(code_path=code_path.format(tmp=dirs), entrypoint=entrypoint)
    refused(logged_in(owner), body, field, words.format(tmp=dirs))


def test_with_no_script_roots_no_folder_is_allowed(owner: Any, dirs: Path, settings: Any) -> None:
    settings.TRAINYARD_SCRIPT_ROOTS = []
    body = script_body(code_path=str(dirs / "root" / "project"))
    refused(logged_in(owner), body, "code_path", "TRAINYARD_SCRIPT_ROOTS is empty")


@pytest.mark.parametrize("strategy", [{"strategy": "ddp"}, {"strategy": "single"}, {}])
def test_another_strategy_is_refused_the_script_fields_by_name(
    owner: Any, dirs: Path, strategy: dict[str, str]
) -> None:
    body = {**strategy, "entrypoint": "train.py", "args": ["-x"], "code_path": "/srv", "code": None}
    response = api_post(logged_in(owner), body)
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"entrypoint", "args", "code_path"}
    assert "only a script run reads it" in response.json()["errors"]["args"][0]
    assert not Experiment.objects.exists()


# --- the launch form and the docs --------------------------------------------------------------


def test_the_study_form_does_not_offer_a_script_run(owner: Any) -> None:
    """The launch page offers one (tests/test_script_form.py); a study's page not yet (its API
    does, with args.* axes: tests/test_study_script_args.py)."""
    page = logged_in(owner).get("/studies/new/").content.decode()
    assert page.count('value="script"') == 0
    facts = page_facts_build()["strategies"]
    assert facts["script"]["form"] is False and facts["ddp"]["form"] is True


def test_the_docs_describe_the_script_fields() -> None:
    properties = LaunchIn.model_json_schema()["properties"]
    assert {"entrypoint", "args", "code", "code_path"} <= set(properties)
    assert properties["args"]["items"] == {"type": "string", "maxLength": MAX_ARG_CHARS}
    assert properties["args"]["maxItems"] == MAX_ARGS
    assert properties["entrypoint"]["maxLength"] == 1000
    assert "POST /api/code/" in properties["code"]["description"]


# --- the worker's command ----------------------------------------------------------------------


@pytest.fixture
def script_run(owner: Any, dirs: Path, experiment_factory: Any) -> Experiment:
    code = stored(owner, tar_gz(FOLDER))
    return experiment_factory(
        owner=owner, strategy="script", processes=2, gpus=[0, 1], entrypoint="train.py",
        args=["--lr", "0.1", "--", "--nproc"], code=code, attempt=2, worker="host-a",
        status=Status.RUNNING,
    )  # fmt: skip


def test_the_training_command_of_a_script_run_is_the_launchers(
    script_run: Experiment, dirs: Path, settings: Any
) -> None:
    settings.TRAINYARD_SCRIPT_STOP_SECONDS = 90
    assert training_command(experiment=script_run)[1:] == [
        "-m", "training", "--run-id", str(script_run.pk), "--strategy", "script",
        "--nproc", "2", "--entrypoint", "train.py",
        "--checkpoint-dir", str(dirs / "runs" / str(script_run.pk) / "checkpoints"),
        "--stop-grace", "90",
        "--profile-dir", str(dirs / "runs" / str(script_run.pk) / "profiles"),
        "--gpus", "0,1",
    ]  # fmt: skip


def started_command(monkeypatch: pytest.MonkeyPatch, run: Experiment, **kwargs: Any) -> list[str]:
    """What RunSupervisor._start would run, with no process started."""
    commands: list[list[str]] = []

    class Started:
        pid = 4321

    def start(*, command: list[str], env: dict[str, str], cwd: Any) -> Started:
        commands.append(command)
        assert str(cwd) == str(runner.settings.BASE_DIR)  # the launcher moves into the code
        return Started()

    monkeypatch.setattr(runner, "training_process_start", start)
    RunSupervisor(experiment=run, sink=EventSink(run), **kwargs)._start()
    return commands[0]


def test_a_script_gets_none_of_the_workers_secrets(
    script_run: Experiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (
        ("SECRET_KEY", "s3cret"),
        ("DATABASE_URL", "postgres://u:p@db/t"),
        ("REDIS_URL", "redis://r"),
        ("AWS_SECRET_ACCESS_KEY", "k"),
        ("CUDA_VISIBLE_DEVICES", "0"),
        ("HF_HOME", "/hf"),
        ("SITE_X", "1"),
        ("TRAINYARD_STALL_SECONDS", "30"),  # Trainyard's own settings of a script run pass
        ("TRAINYARD_OBSERVE_EVERY", "5"),
    ):
        monkeypatch.setenv(name, value)  # fmt: skip
    monkeypatch.setenv("TRAINYARD_SCRIPT_ENV", "SITE_X")
    env = runner.training_environment(experiment=script_run)
    assert not {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "AWS_SECRET_ACCESS_KEY"} & env.keys()
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["HF_HOME"] == "/hf" and env["SITE_X"] == "1"
    assert (env["TRAINYARD_STALL_SECONDS"], env["TRAINYARD_OBSERVE_EVERY"]) == ("30", "5")
    assert env["PATH"] and env["TRAINYARD_RUN_ID"] == str(script_run.pk)
    # The engine's own runs keep the worker's environment (its plug-ins may read it).
    script_run.strategy = "ddp"
    assert runner.training_environment(experiment=script_run)["SECRET_KEY"] == "s3cret"


def test_an_attempt_unpacks_the_code_afresh_and_passes_the_arguments_last(
    script_run: Experiment, dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resume = dirs / "runs" / "ck.pt"
    command = started_command(monkeypatch, script_run, resume=resume)
    folder = dirs / "runs" / str(script_run.pk) / "code" / "attempt-2"
    at = command.index("--code-dir")
    assert command[at + 1] == str(folder)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.*")) == sorted(FOLDER)
    assert (folder / "train.py").read_text() == FOLDER["train.py"]
    # Resume before "--"; the script's arguments after it, as given (its own "--" too).
    assert command.index("--resume") < command.index("--") and str(resume) in command
    split = command.index("--")
    assert command[split + 1 :] == ["--lr", "0.1", "--", "--nproc"]
    assert "--nproc" not in command[split - 2 : split]  # nothing of the launcher's after it
    # A file the last attempt left behind is not in the next one's folder.
    (folder / "written.txt").write_text("left over")
    script_run.attempt = 3
    command = started_command(monkeypatch, script_run)
    fresh = Path(command[command.index("--code-dir") + 1])
    assert fresh.name == "attempt-3" and not (fresh / "written.txt").exists()
    assert Experiment.objects.get(pk=script_run.pk).launcher_pid == 4321


def test_a_folder_on_the_workers_runs_in_place_if_under_this_workers_roots(
    script_run: Experiment, dirs: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    script_run.code, script_run.code_path = None, str(dirs / "root" / "project")
    command = started_command(monkeypatch, script_run)
    assert command[command.index("--code-dir") + 1] == script_run.code_path
    settings.TRAINYARD_SCRIPT_ROOTS = [dirs / "elsewhere"]
    monkeypatch.setattr(runner, "machine_samples_collect", lambda **kwargs: {})
    outcome = RunSupervisor(experiment=script_run, sink=EventSink(script_run)).run()
    assert outcome is not None and outcome.status == Status.FAILED
    assert "the run's code folder on this worker" in outcome.error
    assert "is not under the script roots" in outcome.error


def test_an_upload_lost_from_the_code_folder_fails_the_attempt_clearly(
    script_run: Experiment, dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert script_run.code is not None
    (dirs / "code" / f"{script_run.code.sha256}.tar.gz").unlink()
    outcome = RunSupervisor(experiment=script_run, sink=EventSink(script_run)).run()
    assert outcome is not None and "TRAINYARD_CODE_DIR must be shared" in outcome.error


# --- the sink: a script's metrics --------------------------------------------------------------


def metrics(step: Any, rank: Any, values: Any) -> dict[str, Any]:
    return {"v": 1, "minor": 11, "run": "r", "seq": 1, "type": "metrics", "time": 2.5,
            "step": step, "rank": rank, "values": values}  # fmt: skip


def test_a_scripts_metrics_are_series_per_rank_and_rank_0s_are_the_runs(
    script_run: Experiment,
) -> None:
    sink = EventSink(script_run)
    sent: Any = sink.add(metrics(7, 0, {"loss": 0.5, "train_loss": 0.4, "acc": float("nan")}))
    sink.add(metrics(6, 1, {"loss": 0.75, "note": "text"}))
    sink.flush()
    points = {p.key: (p.step, p.time, p.value) for p in SeriesPoint.objects.all()}
    assert points == {
        "rank/0/loss": (7, 2.5, 0.5), "loss": (7, 2.5, 0.5),
        "rank/0/train_loss": (7, 2.5, 0.4), "train_loss": (7, 2.5, 0.4),  # the engine's name
        "rank/0/acc": (7, 2.5, None), "acc": (7, 2.5, None),
        "rank/1/loss": (6, 2.5, 0.75), "rank/1/note": (6, 2.5, None),
    }  # fmt: skip
    # The page gets a series message (its charts take it), not a type of its own.
    assert sent["type"] == "series" and sent["points"]["loss"] == [[7, 2.5, 0.5]]
    script_run.refresh_from_db()
    assert script_run.step == 7  # rank 0's step; rank 1's (behind it) did not move it back


def test_once_the_observers_steps_come_the_scripts_own_numbering_no_longer_moves_the_row(
    script_run: Experiment,
) -> None:
    """The script counts its own steps (here in samples); the observer counts optimizer steps:
    the row follows the observer's, not each in turn."""
    sink = EventSink(script_run)
    sink.add(metrics(3200, 0, {"loss": 0.5}))
    sink.flush()
    script_run.refresh_from_db()
    assert script_run.step == 3200  # no step event yet: the script's is all there is
    window = {"v": 1, "minor": 12, "run": "r", "seq": 2, "type": "step", "time": 3.0,
              "epoch": 0, "step": 100}  # fmt: skip
    sink.add(window)
    sink.add(metrics(6400, 0, {"loss": 0.4}))
    sink.flush()
    script_run.refresh_from_db()
    assert script_run.step == 100
    assert SeriesPoint.objects.get(key="loss", step=6400).value == 0.4  # its figure kept


@pytest.mark.parametrize(
    "event",
    [
        metrics(-1, 0, {"loss": 1}),
        metrics(True, 0, {"loss": 1}),
        metrics(2**31, 0, {"loss": 1}),
        metrics(1, MAX_RANKS, {"loss": 1}),
        metrics(1, "0", {"loss": 1}),
        metrics(1, 0, [["loss", 1]]),
        metrics(1, 0, {"": 1, "x" * 200: 1, "rank/3/loss": 1, "machine/h/cpu_percent": 1}),
    ],
)
def test_a_metrics_event_out_of_bounds_stores_nothing(
    script_run: Experiment, event: dict[str, Any]
) -> None:
    sink = EventSink(script_run)
    assert sink.add(event) == {"type": "series", "seq": script_run.last_seq + 1, "points": {}}
    sink.flush()
    assert not SeriesPoint.objects.exists()
    assert Experiment.objects.get(pk=script_run.pk).step == 0


def test_one_metrics_event_stores_at_most_its_bound(script_run: Experiment) -> None:
    sink = EventSink(script_run)
    sink.add(metrics(1, 2, {f"m{i}": i for i in range(MAX_METRICS_VALUES + 50)}))
    sink.flush()
    assert SeriesPoint.objects.count() == MAX_METRICS_VALUES
    assert not SeriesPoint.objects.filter(key=f"rank/2/m{MAX_METRICS_VALUES}").exists()


def test_a_users_code_goes_with_the_user_and_their_runs(script_run: Experiment) -> None:
    """The code is kept while a run uses it (the record of what ran), but not past its owner."""
    assert script_run.code is not None
    with pytest.raises(RestrictedError):
        script_run.code.delete()
    script_run.owner.delete()
    assert not CodeArchive.objects.exists() and not Experiment.objects.exists()


def test_the_admin_shows_what_ran_and_a_clone_runs_the_same_code(
    script_run: Experiment, user_factory: Any
) -> None:
    staff = user_factory(username="boss", staff=True, is_superuser=True)
    page = logged_in(staff).get(f"/admin/experiments/experiment/{script_run.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200 and "--lr" in html and 'name="entrypoint"' not in html
    again = experiment_clone(experiment=script_run, owner=staff)
    assert (again.strategy, again.entrypoint, again.args) == ("script", "train.py", script_run.args)
    assert again.code == script_run.code and again.code_path == ""


def test_the_engine_has_no_module_for_a_script_run() -> None:
    """The CLI launches a script before the engine would look for one; asked, it says why."""
    assert {spec.name for spec in REGISTRY if spec.user_script} == {"script"}
    assert strategy_module("ddp").__name__ == "training.strategies.ddp"
    with pytest.raises(ValueError, match="runs your own script"):
        strategy_module("script")
    assert importlib.util.find_spec("training.strategies.script") is None


# --- what the review of the script runs found ---------------------------------------------------


def test_a_figure_past_a_floats_range_is_stored_as_no_value(script_run: Experiment) -> None:
    sink = EventSink(script_run)
    sink.add(metrics(1, 0, {"huge": 10**400, "loss": 0.5}))  # JSON allows it; float() does not
    sink.flush()
    points = {p.key: p.value for p in SeriesPoint.objects.filter(key__in=["huge", "loss"])}
    assert points == {"huge": None, "loss": 0.5}


def test_a_scripts_lines_still_reach_its_log_while_its_ranks_agree_on_a_stop() -> None:
    state = AttemptState(stopped_by="alice", stop_deadline=10.0)
    relay = EventRelay(state=state)
    relay.line_relay("stderr", "[trainyard] 2026-12-06 00:00:00 rank 1 STDOUT | saving\n", now=0)
    assert [b["message"] for b in relay.stderr_relay(0.5)] == ["saving"]
    state.stop_deadline = None  # its time is up: what the ending prints is noise
    relay.line_relay("stderr", "Traceback (most recent call last):\n", now=1)
    assert relay.stderr_relay(5) == []


def test_a_later_attempt_resumes_from_a_checkpoint_folder_in_the_runs_folder(
    script_run: Experiment, dirs: Path
) -> None:
    folder = dirs / "runs" / str(script_run.pk) / "checkpoints" / "out" / "checkpoint-8"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    outside = dirs / "elsewhere" / "checkpoint-9"
    outside.mkdir(parents=True)
    for step, path in ((8, folder), (9, outside)):
        Checkpoint.objects.create(experiment=script_run, epoch=0, step=step, path=str(path))
    latest = checkpoint_latest(experiment_id=script_run.pk)
    assert latest is not None and latest.step == 8  # a folder will do; not outside the run's
