"""Studies without a worker: the API's refusals and what it creates (every run or none), the
one-launch limits, stop, privacy, the form page, and the table's figures from stored points
checked against a hand computation. (tests/test_studies_live.py runs a study on the real stack.)"""

from __future__ import annotations

import csv
import io
import json
import statistics
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from dashboard.experiments.models import Experiment, SeriesPoint, Status
from dashboard.studies.api_schemas import StudyOut
from dashboard.studies.forms import StudyForm
from dashboard.studies.models import Study, StudyRun
from tests.factories import CPU_STRATEGIES, reader_attach
from training.registry import COMM_HOOK, OPTIONS_DECLARED, option_strategies

pytestmark = pytest.mark.django_db

TWO_BY_TWO = {
    "name": "2x2",
    "base": {"dataset": "mnist", "epochs": 1, "batch_size": 64},
    "axes": {"strategy": ["single", "ddp"], "seed": [1, 2]},
    "target_accuracy": 0.9,
    "stop_at_target": True,
}


@pytest.fixture
def client(alice_client: Client) -> Client:
    return alice_client


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(reverse("api-studies"), json.dumps(body), content_type="application/json")


def test_a_two_by_two_study_queues_four_named_runs(
    client: Client, alice: Any, launched: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, TWO_BY_TWO)
    assert response.status_code == 201, response.content
    body = response.json()
    runs = Experiment.objects.filter(pk__in=body["runs"]).order_by("pk")
    assert len(body["runs"]) == 4 and sorted(launched) == sorted(body["runs"])
    assert [(e.strategy, e.processes, e.seed) for e in runs] == [
        ("single", 1, 1), ("single", 1, 2), ("ddp", 2, 1), ("ddp", 2, 2),
    ]  # fmt: skip
    assert [e.name for e in runs][1:3] == ["2x2 · Single · seed 2", "2x2 · DDP ×2 · seed 1"]
    # Stop at target: each run carries the target the engine stops at.
    assert {e.target_accuracy for e in runs} == {0.9}
    assert {e.owner_id for e in runs} == {alice.pk}
    detail = client.get(reverse("api-study", args=[body["id"]])).json()
    assert detail["status"] == "queued" and detail["runs"] == body["runs"]
    assert [(c["strategy"], c["processes"], c["world_size"]) for c in detail["cells"]] == [
        ("single", 1, 1), ("ddp", 2, 2),
    ]  # fmt: skip
    for cell in detail["cells"]:
        assert cell["time_to_target_seconds"] is None and cell["speedup"] is None
        for key in ("nodes", "runs", "final_accuracy_mean", "images_per_second", "efficiency"):
            assert key in cell


def test_without_stop_at_target_runs_train_every_epoch(client: Client, launched: Any) -> None:
    body = post(client, {**TWO_BY_TWO, "stop_at_target": False}).json()
    assert {e.target_accuracy for e in Experiment.objects.filter(pk__in=body["runs"])} == {None}


@pytest.mark.parametrize(
    ("change", "field", "cell_index"),
    [
        ({"axes": {"strategy": ["single", "ddp"], "processes": [2, 0]}}, "processes", 2),
        ({"axes": {"seed": [1, 2], "lr": [0.01, 50.0]}}, "lr", 2),
        ({"axes": {"strategy": ["ddp", "warp-drive"]}}, "strategy", 2),
        ({"base": {"epochs": 1, "colour": "blue"}}, "colour", 1),
    ],
)
def test_one_invalid_cell_refuses_the_study_and_creates_nothing(
    client: Client, launched: list[int], change: dict[str, Any], field: str, cell_index: int
) -> None:
    response = post(client, {**TWO_BY_TWO, **change})
    assert response.status_code == 400
    body = response.json()
    assert field in body["errors"], body
    assert body["cell"]["index"] == cell_index
    assert f"cell {cell_index} of" in body["error"] and "nothing was created" in body["error"]
    assert (Experiment.objects.count(), Study.objects.count(), launched) == (0, 0, [])


def test_at_most_48_runs(client: Client, launched: list[int]) -> None:
    axes = {"seed": list(range(7)), "lr": [0.001 * k for k in range(1, 8)]}  # 49
    response = post(client, {**TWO_BY_TWO, "axes": axes})
    assert response.status_code == 400
    assert "49 runs; a study has at most 48" in response.json()["error"]
    assert Experiment.objects.count() == 0
    axes["lr"] = axes["lr"][:6]  # 42
    assert post(client, {**TWO_BY_TWO, "axes": axes}).status_code == 201
    assert Experiment.objects.count() == 42


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"axes": {"colour": ["red"]}}, "axes.colour"),
        ({"axes": {"seed": []}}, "axes.seed"),
        ({"axes": {"seed": [1, 1]}}, "axes.seed"),
        ({"target_accuracy": 1.5}, "target_accuracy"),
        ({"target_accuracy": None}, "target_accuracy"),
        ({"stop_at_target": "yes"}, "stop_at_target"),
        ({"name": ""}, "name"),
        ({"batch_mode": "huge"}, "batch_mode"),
        ({"base": {"name": "mine"}}, "base.name"),
    ],
)
def test_bad_study_fields_are_refused(
    client: Client, launched: Any, body: dict[str, Any], field: str
) -> None:
    response = post(client, {**TWO_BY_TWO, **body})
    assert response.status_code == 400 and field in response.json()["errors"]
    assert Study.objects.count() == 0


def test_cells_the_launch_checks_make_alike_are_one_run(client: Client, launched: Any) -> None:
    # Single takes no processes: the form normalises them to 1, so single x {1, 2} is one run.
    body = {**TWO_BY_TWO, "axes": {"strategy": ["single", "ddp"], "processes": [1, 2]}}
    runs = Experiment.objects.filter(pk__in=post(client, body).json()["runs"])
    assert sorted((e.strategy, e.processes) for e in runs) == [
        ("ddp", 1), ("ddp", 2), ("single", 1),
    ]  # fmt: skip


def test_same_global_batch_splits_the_batch_over_processes(client: Client, launched: Any) -> None:
    body = {
        **TWO_BY_TWO,
        "base": {"batch_size": 128},
        "axes": {"strategy": ["single", "ddp", "hogwild"], "processes": [2]},
        "batch_mode": "global",
    }
    runs = Experiment.objects.filter(pk__in=post(client, body).json()["runs"])
    assert sorted((e.strategy, e.processes, e.batch_size) for e in runs) == [
        ("ddp", 2, 64), ("hogwild", 2, 64), ("single", 1, 128),
    ]  # fmt: skip
    refused = post(client, {**body, "base": {"batch_size": 127}})
    assert refused.status_code == 400
    assert "127 does not split over 2 processes" in refused.json()["errors"]["batch_size"][0]
    # Ranks that split the model share one batch: the whole global batch, not a share each.
    shared = {**body, "axes": {"strategy": ["pipeline", "tensor-parallel"], "processes": [2]}}
    runs = Experiment.objects.filter(pk__in=post(client, shared).json()["runs"])
    assert sorted((e.strategy, e.batch_size) for e in runs) == [
        ("pipeline", 128), ("tensor-parallel", 128),
    ]  # fmt: skip


def test_a_study_is_one_launch_for_the_limits(client: Client, launched: Any, settings: Any) -> None:
    settings.TRAINYARD_MAX_ACTIVE_RUNS_PER_USER = 2
    settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE = 100
    assert post(client, TWO_BY_TWO).status_code == 201  # 4 runs queue past the active limit
    one = client.post(
        reverse("api-experiments"),
        json.dumps({"strategy": "single"}),
        content_type="application/json",
    )
    assert one.status_code == 429  # a single launch still meets the limit
    settings.TRAINYARD_LAUNCH_RATE_PER_MINUTE = 4  # the study's 4 runs used the minute's quota
    limited = post(client, TWO_BY_TWO)
    assert limited.status_code == 429 and limited.json()["limit"] == "launch_rate"
    assert Study.objects.count() == 1


def test_another_user_sees_neither_the_study_nor_its_runs(
    client: Client, launched: Any, user_factory: Any
) -> None:
    body = post(client, TWO_BY_TWO).json()
    bob = Client()
    bob.force_login(user_factory(username="bob"))
    pk = body["id"]
    assert bob.get(reverse("api-study", args=[pk])).status_code == 404
    assert bob.post(reverse("api-study-stop", args=[pk])).status_code == 404
    assert bob.get(reverse("api-study-export", args=[pk])).status_code == 404
    assert bob.get(reverse("study-detail", args=[pk])).status_code == 404
    assert bob.get(reverse("api-studies")).json() == {"studies": []}
    for run in body["runs"]:
        assert bob.get(reverse("api-experiment", args=[run])).status_code == 404
    assert "2x2" not in bob.get(reverse("study-list")).content.decode()
    assert Experiment.objects.filter(status=Status.QUEUED).count() == 4


def test_stopping_a_study_cancels_queued_and_stops_running_runs(
    client: Client, alice: Any, launched: Any
) -> None:
    body = post(client, TWO_BY_TWO).json()
    running, done, *queued = body["runs"]
    Experiment.objects.filter(pk=running).update(status=Status.RUNNING)
    Experiment.objects.filter(pk=done).update(status=Status.SUCCEEDED)
    response = client.post(reverse("api-study-stop", args=[body["id"]]))
    assert response.status_code == 200
    assert sorted(response.json()["stopping"]) == sorted([running, *queued])
    runs = {e.pk: e for e in Experiment.objects.all()}
    assert {runs[pk].status for pk in queued} == {Status.CANCELLED}
    assert runs[running].cancel_requested_at is not None and runs[running].cancelled_by == alice
    assert runs[done].status == Status.SUCCEEDED and runs[done].cancel_requested_at is None


def test_stopping_a_study_that_has_ended_changes_nothing(client: Client, launched: Any) -> None:
    body = post(client, TWO_BY_TWO).json()
    Experiment.objects.filter(pk__in=body["runs"]).update(status=Status.SUCCEEDED)
    stopped = client.post(reverse("api-study-stop", args=[body["id"]])).json()
    assert stopped["stopping"] == []
    assert client.get(reverse("api-study", args=[body["id"]])).json()["status"] == "succeeded"


def points_add(run: Experiment, *, accuracies: list[tuple[int, float, float]], ips: float) -> None:
    """Epoch points (step, time, test accuracy) and two step points at `ips` images/s."""
    for step, time_, value in accuracies:
        SeriesPoint.objects.create(
            experiment=run, key="test_accuracy", step=step, time=time_, value=value
        )
    for step in (1, 10):
        SeriesPoint.objects.create(
            experiment=run, key="images_per_second", step=step, time=step / 10, value=ips
        )


def test_the_table_from_stored_points(client: Client, launched: Any) -> None:
    body = post(client, {**TWO_BY_TWO, "stop_at_target": False}).json()
    single1, single2, ddp1, ddp2 = (Experiment.objects.get(pk=pk) for pk in body["runs"])
    points_add(single1, accuracies=[(60, 9.0, 0.85), (120, 18.0, 0.93)], ips=400.0)
    points_add(single2, accuracies=[(60, 8.0, 0.91), (120, 16.0, 0.95)], ips=440.0)
    points_add(ddp1, accuracies=[(30, 5.0, 0.92)], ips=700.0)
    points_add(ddp2, accuracies=[(30, 6.0, 0.89)], ips=740.0)
    for run, accuracy in ((single1, 0.93), (single2, 0.95), (ddp1, 0.92), (ddp2, 0.89)):
        Experiment.objects.filter(pk=run.pk).update(status=Status.SUCCEEDED, test_accuracy=accuracy)
    single, ddp = client.get(reverse("api-study", args=[body["id"]])).json()["cells"]
    # By hand: single's seeds reached 0.9 at 18 s (step 120 x 64) and 8 s (step 60 x 64).
    assert single["time_to_target_seconds"] == pytest.approx(13.0)
    assert single["images_to_target"] == pytest.approx((120 * 64 + 60 * 64) / 2)
    assert single["final_accuracy_mean"] == pytest.approx(0.94)
    assert single["final_accuracy_std"] == pytest.approx(statistics.stdev([0.93, 0.95]))
    assert (single["speedup"], single["efficiency"]) == (1.0, 1.0)
    # DDP's second seed never reached 0.9: no time, and the cell says how many did.
    assert ddp["time_to_target_seconds"] is None and ddp["runs_reached"] == 1
    assert ddp["texts"]["reached"] == "only 1 of 2 reached 90%"
    assert ddp["images_per_second"] == pytest.approx(720.0)
    assert ddp["speedup"] == pytest.approx(720.0 / 420.0)
    assert ddp["efficiency"] == pytest.approx(720.0 / 420.0 / 2)
    assert ddp["global_batch"] == 128
    export = client.get(reverse("api-study-export", args=[body["id"]]))
    rows = list(csv.DictReader(io.StringIO(export.content.decode())))
    assert [r["strategy"] for r in rows] == ["single", "ddp"]
    assert float(rows[0]["time_to_target_seconds"]) == pytest.approx(13.0)
    assert rows[1]["time_to_target_seconds"] == ""
    assert float(rows[1]["speedup"]) == pytest.approx(720.0 / 420.0)
    page = client.get(reverse("study-detail", args=[body["id"]])).content.decode()
    assert "13.0 s" in page and "1.71×" in page and "86%" in page
    assert "Different global batch sizes" in page  # 64 against 128: the compare page's warning


def test_a_resumed_run_gives_no_seconds_to_target(client: Client, launched: Any) -> None:
    body = post(client, {**TWO_BY_TWO, "stop_at_target": False}).json()
    single1, single2, *_ = (Experiment.objects.get(pk=pk) for pk in body["runs"])
    points_add(single1, accuracies=[(120, 18.0, 0.93)], ips=400.0)
    # Lost after its first attempt, resumed: its points' clock restarted at the resume.
    points_add(single2, accuracies=[(120, 4.0, 0.95)], ips=440.0)
    Experiment.objects.filter(pk=single2.pk).update(attempt=2)
    single = client.get(reverse("api-study", args=[body["id"]])).json()["cells"][0]
    assert single["time_to_target_seconds"] is None
    assert single["images_to_target"] == pytest.approx(120 * 64)  # steps do not restart
    assert "no time: a run resumed after a lost attempt" in single["texts"]["reached"]


def test_the_form_page_launches_a_scaling_study(client: Client, launched: Any) -> None:
    page = client.get(reverse("study-new")).content.decode()
    assert "Same batch per process" in page and "Same global batch" in page
    response = client.post(
        reverse("study-new"),
        {
            "name": "scaling", "dataset": "mnist", "epochs": "1", "batch_size": "64",
            "lr": "0.001", "optimizer": "adam", "target_accuracy": "0.85",
            "batch_mode": "per_process", "mode": "scaling", "strategies": ["single", "ddp"],
            "process_counts": "1, 2", "seeds": "1, 2",
        },
    )  # fmt: skip
    study = Study.objects.get()
    assert response.status_code == 302 and response["Location"] == study.get_absolute_url()
    assert StudyRun.objects.filter(study=study).count() == 6  # single, ddp x1, ddp x2; 2 seeds
    assert study.axes == {"strategy": ["single", "ddp"], "processes": [1, 2], "seed": [1, 2]}
    listed = client.get(reverse("study-list")).content.decode()
    assert study.get_absolute_url() in listed


def test_the_study_form_offers_the_workers_models_and_data_with_help_that_is_not_stale(
    client: Client, launched: Any
) -> None:
    """Issue 34 item 10: models and datasets offered as the launch form offers them, the
    process counts' help naming every strategy that takes one (the registry's), and a default
    target the default epoch reaches."""
    from dashboard.devices.models import WorkerMachine
    from dashboard.experiments.core.forms import FORM_STRATEGIES
    from dashboard.studies.texts import PROCESS_COUNTS_HELP, TARGET_DEFAULT
    from training.registry import REGISTRY

    report = {
        "cpu_count": 4, "gpus": [], "models": ["simple-cnn", "resnet18"],
        "model_sources": {"simple-cnn": "built in", "resnet18": "torchvision"},
        "datasets": ["mnist", "fashion-mnist"],
        "dataset_details": [
            {"name": "mnist", "sample": True, "train_images": 4000, "source": "the sample"},
            {"name": "fashion-mnist", "train_images": 60000, "source": "Debian's"},
        ],
    }  # fmt: skip
    from django.utils import timezone

    WorkerMachine.objects.create(hostname="box", report=report, reported_at=timezone.now())
    page = client.get(reverse("study-new")).content.decode()
    assert '<optgroup label="torchvision">' in page and '<option value="resnet18">' in page
    assert '<option value="mnist" selected>mnist (the 5,000-digit sample)</option>' in page
    assert '<option value="fashion-mnist">fashion-mnist</option>' in page
    assert "For DDP, Hogwild and DeepSpeed, e.g. 2, 4." not in page
    for spec in REGISTRY:
        if spec.name in FORM_STRATEGIES and spec.processes:
            assert spec.short in PROCESS_COUNTS_HELP
    assert PROCESS_COUNTS_HELP in page
    assert f'name="target_accuracy" value="{TARGET_DEFAULT}"' in page
    # The default CNN is at about 0.94 after the default one epoch of the sample.
    assert StudyForm().fields["epochs"].initial == 1 and TARGET_DEFAULT <= 0.94


def test_the_form_page_shows_the_bad_cell(client: Client, launched: Any) -> None:
    response = client.post(
        reverse("study-new"),
        {
            "name": "axes", "dataset": "mnist", "epochs": "1", "batch_size": "64",
            "lr": "0.001", "optimizer": "adam", "target_accuracy": "0.9",
            "batch_mode": "per_process", "mode": "axes", "axis_strategy": "ddp",
            "axis_processes": "2, 999",
        },
    )  # fmt: skip
    assert response.status_code == 400
    html = response.content.decode()
    assert "cell 2 of 2 (strategy=ddp, processes=999)" in html
    assert Study.objects.count() == 0
    typo = client.post(reverse("study-new"), {"mode": "axes", "axis_seed": "1, x"})
    assert "&#x27;x&#x27; is not a whole number" in typo.content.decode()


def test_the_admin_lists_a_study_with_its_runs(
    client: Client, launched: Any, user_factory: Any
) -> None:
    pk = post(client, TWO_BY_TWO).json()["id"]
    staff = Client()
    staff.force_login(user_factory(username="root", staff=True, is_superuser=True))
    listed = staff.get(reverse("admin:studies_study_changelist"))
    assert listed.status_code == 200 and "2x2" in listed.content.decode()
    change = staff.get(reverse("admin:studies_study_change", args=[pk]))
    assert change.status_code == 200 and "2x2 · DDP ×2 · seed 2" in change.content.decode()


# --- strategy options as axes -------------------------------------------------------------------


def test_an_option_axis_runs_where_read_and_skips_the_cells_that_do_not_read_it(
    client: Client, launched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = reader_attach(COMM_HOOK, monkeypatch)
    other = next(name for name in CPU_STRATEGIES if name not in option_strategies(COMM_HOOK))
    hooks = ["none", "fp16", "powersgd"]
    body = {**TWO_BY_TWO, "axes": {"strategy": [reader, other], "comm_hook": hooks}}
    response = post(client, body)
    assert response.status_code == 201, response.content
    study = response.json()
    runs = Experiment.objects.filter(pk__in=study["runs"]).order_by("pk")
    # The reader at every hook; the other strategy once, at the default it does not read.
    assert [(e.strategy, e.comm_hook) for e in runs] == [
        *((reader, hook) for hook in hooks), (other, None),
    ]  # fmt: skip
    assert runs[2].name.endswith("comm hook powersgd · seed 1")
    assert [cell["text"] for cell in study["skipped"]] == [
        f"strategy={other}, comm_hook=fp16", f"strategy={other}, comm_hook=powersgd",
    ]  # fmt: skip
    assert all(f"comm_hook applies to --strategy {reader}" in c["reason"] for c in study["skipped"])
    # The table says each cell's options off their default, as the compare page does.
    assert [c["options_label"] for c in study["cells"]] == ["", "fp16", "PowerSGD", ""]
    page = client.get(reverse("study-detail", args=[study["id"]])).content.decode()
    assert "Skipped cells" in page and "(PowerSGD)" in page
    export = client.get(reverse("api-study-export", args=[study["id"]]))
    rows = list(csv.DictReader(io.StringIO(export.content.decode())))
    assert [row["comm_hook"] for row in rows] == [*hooks, ""]


def test_a_study_whose_every_cell_is_skipped_is_refused(
    client: Client, launched: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader_attach(COMM_HOOK, monkeypatch)
    other = next(name for name in CPU_STRATEGIES if name not in option_strategies(COMM_HOOK))
    response = post(client, {**TWO_BY_TWO, "axes": {"strategy": [other], "comm_hook": ["fp16"]}})
    assert response.status_code == 400
    assert "sets an option its strategy does not read" in response.json()["error"]
    assert not Study.objects.exists() and not launched


def test_the_axes_editor_reads_each_option_as_its_kind(client: Client, launched: Any) -> None:
    page = client.get(reverse("study-new")).content.decode()
    for option in OPTIONS_DECLARED:
        assert f'name="axis_{option.name}"' in page
    form = StudyForm(
        {
            "name": "kinds", "dataset": "mnist", "epochs": "1", "batch_size": "64",
            "lr": "0.001", "optimizer": "adam", "target_accuracy": "0.9",
            "batch_mode": "per_process", "mode": "axes", "axis_shard_optimizer": "false, on",
            "axis_accumulate": "1, 4", "axis_precision": "fp32, bf16",
        }
    )  # fmt: skip
    assert form.is_valid(), form.errors
    assert form.cleaned_data["axes"] == {
        "shard_optimizer": [False, True], "accumulate": [1, 4], "precision": ["fp32", "bf16"],
    }  # fmt: skip
    typo = StudyForm({"mode": "axes", "axis_compile": "maybe"})
    assert not typo.is_valid()
    assert typo.errors["axis_compile"] == ["'maybe' is not true or false"]


# --- which cell trains fastest to the target (issue 18's question) ------------------------------

HOOKS_STUDY = {
    **TWO_BY_TWO,
    "name": "hooks",
    "axes": {"strategy": ["ddp", "fsdp"], "comm_hook": ["none", "fp16"], "seed": [1, 2]},
    "stop_at_target": False,
}


def hooks_study(client: Client) -> tuple[int, list[list[Experiment]]]:
    """Issue 18's study (FSDP at fp16 skipped): its id and each cell's runs, in table order."""
    created = post(client, HOOKS_STUDY).json()
    cells = client.get(reverse("api-study", args=[created["id"]])).json()["cells"]
    assert [(c["strategy"], c["config"]["comm_hook"]) for c in cells] == [
        ("ddp", "none"), ("ddp", "fp16"), ("fsdp", None),
    ]  # fmt: skip
    return created["id"], [[Experiment.objects.get(pk=pk) for pk in c["runs"]] for c in cells]


def cell_reaches(runs: list[Experiment], seconds: list[float]) -> float:
    """Each run reaches the target at its seconds and succeeds; the cell's time by hand."""
    for run, time_ in zip(runs, seconds, strict=True):
        points_add(run, accuracies=[(30, time_ / 2, 0.5), (60, time_, 0.95)], ips=500.0)
    Experiment.objects.filter(pk__in=[e.pk for e in runs]).update(status=Status.SUCCEEDED)
    return statistics.fmean(seconds)


def fastest_of(client: Client, pk: int) -> tuple[dict[str, Any] | None, str]:
    body = client.get(reverse("api-study", args=[pk])).json()
    StudyOut.model_validate(body)  # the answer is what /api/schema/ says it is
    return body["fastest"], body["fastest_text"]


def test_the_fastest_cell_to_the_target_and_by_how_much(client: Client, launched: Any) -> None:
    pk, (ddp, ddp_fp16, fsdp) = hooks_study(client)
    ddp_time = cell_reaches(ddp, [10.0, 14.5])
    fp16_time = cell_reaches(ddp_fp16, [8.0, 9.5])
    cell_reaches(fsdp[:1], [5.0])  # faster, but its other seed never got there: no time
    points_add(fsdp[1], accuracies=[(60, 10.0, 0.85)], ips=500.0)
    Experiment.objects.filter(pk=fsdp[1].pk).update(status=Status.SUCCEEDED)
    fastest, text = fastest_of(client, pk)
    assert fastest is not None
    assert (fastest["cell"], fastest["label"]) == (1, "ddp, comm_hook fp16")
    assert fastest["values"] == {"strategy": "ddp", "comm_hook": "fp16"}
    assert fastest["time_to_target_seconds"] == pytest.approx(fp16_time)
    assert (fastest["runs_reached"], fastest["runs"]) == (2, 2)
    assert fastest["next"]["cell"] == 0 and fastest["tied"] == []
    assert fastest["ratio"] == pytest.approx(ddp_time / fp16_time)
    assert (fastest["reached"], fastest["not_reached"], fastest["pending"]) == (2, 1, 0)
    assert fastest["final"] is True
    assert text == (
        f"Fastest to 90%: ddp, comm_hook fp16, {fp16_time:.1f} s ({ddp_time / fp16_time:.2f}× "
        "faster than ddp, comm_hook none); 1 cell did not reach it."
    )
    page = client.get(reverse("study-detail", args=[pk])).content.decode()
    assert f'<p id="study-fastest" aria-live="polite"><strong>{text}</strong></p>' in page


def test_the_answer_is_not_final_while_a_cell_could_still_win(
    client: Client, launched: Any
) -> None:
    pk, (ddp, ddp_fp16, fsdp) = hooks_study(client)
    ddp_time = cell_reaches(ddp, [10.0, 14.0])
    cell_reaches(ddp_fp16, [12.0, 13.0])
    cell_reaches(fsdp[:1], [6.0])
    Experiment.objects.filter(pk=fsdp[1].pk).update(status=Status.RUNNING)
    fastest, text = fastest_of(client, pk)
    assert fastest is not None and fastest["label"] == "ddp, comm_hook none"
    assert (fastest["final"], fastest["pending"], fastest["not_reached"]) == (False, 1, 0)
    assert text.startswith("Fastest to 90% so far: ddp, comm_hook none, ")
    assert text.endswith("; 1 cell not finished yet.")
    # The running seed gets there: FSDP, which was pending, wins.
    fsdp_time = cell_reaches(fsdp, [6.0, 7.0])
    fastest, text = fastest_of(client, pk)
    assert fastest is not None and (fastest["cell"], fastest["label"]) == (2, "fsdp")
    assert fastest["values"] == {"strategy": "fsdp"}  # it does not read the hook
    assert fastest["next"]["label"] == "ddp, comm_hook none" and fastest["final"] is True
    assert fastest["ratio"] == pytest.approx(ddp_time / fsdp_time)
    assert text.startswith("Fastest to 90%: fsdp, ")
    assert text.endswith("faster than ddp, comm_hook none).")


def test_no_cell_reached_the_target(client: Client, launched: Any) -> None:
    pk, cells = hooks_study(client)
    assert fastest_of(client, pk) == (None, "No cell has reached 90% yet.")
    for run in (run for runs in cells for run in runs):
        points_add(run, accuracies=[(60, 10.0, 0.6)], ips=500.0)
    Experiment.objects.filter(pk__in=[e.pk for runs in cells for e in runs]).update(
        status=Status.SUCCEEDED
    )
    assert fastest_of(client, pk) == (None, "No cell reached 90%.")
    page = client.get(reverse("study-detail", args=[pk])).content.decode()
    assert "<strong>No cell reached 90%.</strong>" in page


def test_cells_the_table_shows_alike_are_a_tie_won_by_the_earlier(
    client: Client, launched: Any
) -> None:
    pk, (ddp, ddp_fp16, fsdp) = hooks_study(client)
    ddp_time = cell_reaches(ddp, [10.0, 12.08])  # 11.04 s: shown as 11.0 s
    fsdp_time = cell_reaches(fsdp, [11.0, 11.0])  # a little faster, shown alike
    cell_reaches(ddp_fp16, [20.0, 22.0])
    assert fsdp_time < ddp_time and f"{fsdp_time:.1f}" == f"{ddp_time:.1f}"
    fastest, text = fastest_of(client, pk)
    assert fastest is not None and fastest["cell"] == 0  # the earlier in table order
    assert fastest["time_to_target_seconds"] == pytest.approx(ddp_time)
    assert [other["label"] for other in fastest["tied"]] == ["fsdp"]
    assert fastest["next"]["cell"] == 2 and fastest["ratio"] == 1.0
    assert text == f"Fastest to 90%: ddp, comm_hook none, tied with fsdp at {ddp_time:.1f} s."
