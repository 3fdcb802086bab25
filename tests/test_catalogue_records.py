"""A run's model and data where runs are compared and kept (issue 17): the speedup only
against a single run of the same model and dataset, compare and studies say the model, and an
export imported back keeps model, dataset and data path."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from dashboard.experiments.models import Experiment, SeriesPoint
from dashboard.studies.cells import baseline_find
from tests.test_scaling import run_make

pytestmark = pytest.mark.django_db

FOLDER = "/data/imagefolders/pets"


@pytest.fixture
def client(alice_client: Client) -> Client:
    return alice_client


def compare_rows(client: Client, *runs: Experiment) -> list[dict[str, Any]]:
    ids = ",".join(str(run.pk) for run in runs)
    response = client.get(reverse("api-experiments-compare") + f"?ids={ids}")
    assert response.status_code == 200, response.content
    return response.json()["runs"]


def test_a_speedup_is_only_against_a_single_run_of_the_same_model_and_data(
    alice: Any, client: Client
) -> None:
    single: dict[str, Any] = {"strategy": "single", "processes": 1}
    cnn = run_make(alice, ips=[100], **single, age=10)
    resnet = run_make(alice, ips=[20], **single, model="resnet18", age=20)
    # Newer, but other data: never a resnet's baseline on mnist.
    run_make(alice, ips=[5], **single, model="resnet18", dataset="imagefolder", data_path=FOLDER)
    ddp_cnn = run_make(alice, ips=[180])
    ddp_resnet = run_make(alice, ips=[36], model="resnet18")
    ddp_alone = run_make(alice, ips=[36], model="mobilenet_v2")
    rows = {row["id"]: row for row in compare_rows(client, ddp_cnn, ddp_resnet, ddp_alone)}
    assert rows[ddp_cnn.pk]["baseline"]["id"] == cnn.pk
    assert rows[ddp_cnn.pk]["speedup"] == pytest.approx(1.8)
    assert rows[ddp_resnet.pk]["baseline"]["id"] == resnet.pk
    assert rows[ddp_resnet.pk]["speedup"] == pytest.approx(1.8)
    assert rows[ddp_alone.pk]["baseline"] is None and rows[ddp_alone.pk]["speedup"] is None
    assert rows[ddp_resnet.pk]["model"] == "resnet18"
    page = client.get(reverse("experiment-compare") + f"?ids={ddp_resnet.pk}").content.decode()
    assert '<td data-field="model">resnet18 on MNIST</td>' in page


def test_a_study_cell_is_compared_with_the_single_cell_of_its_model() -> None:
    def cell(model: str, strategy: str) -> dict[str, Any]:
        config = {"model": model, "dataset": "mnist", "data_path": "", "lr": 0.001,
                  "optimizer": "adam", "epochs": 1, "batch_size": 64,
                  "strategy": strategy}  # fmt: skip
        return {"config": config, "global_batch": 128}

    singles = [cell("simple-cnn", "single"), cell("resnet18", "single")]
    assert baseline_find(cell("resnet18", "ddp"), singles) is singles[1]
    assert baseline_find(cell("simple-cnn", "ddp"), singles) is singles[0]
    # The only single run, but of another model: no baseline rather than a wrong one.
    assert baseline_find(cell("mobilenet_v2", "ddp"), singles[:1]) is None


def trained(alice: Any) -> Experiment:
    run = Experiment.objects.create(
        owner=alice, name="pets", strategy="ddp", status="succeeded", model="resnet18",
        dataset="imagefolder", data_path=FOLDER,
    )  # fmt: skip
    for step in (1, 2, 3):
        SeriesPoint.objects.create(
            experiment=run, key="train_loss", step=step, time=step, value=1 / step
        )
    return run


def test_the_json_export_says_the_model_and_data(alice: Any, client: Client) -> None:
    run = trained(alice)
    response = client.get(reverse("api-experiment-export", args=[run.pk]) + "?format=json")
    head = json.loads(b"".join(response.streaming_content))
    assert (head["model"], head["dataset"], head["data_path"]) == (
        "resnet18", "imagefolder", FOLDER,
    )  # fmt: skip


def test_a_tensorboard_export_imports_back_with_model_dataset_and_data_path(
    alice: Any, client: Client
) -> None:
    run = trained(alice)
    response = client.get(reverse("api-experiment-export", args=[run.pk]) + "?format=tensorboard")
    assert response.status_code == 200
    archive = b"".join(response.streaming_content)
    with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
        assert len(zipped.namelist()) == 1  # still one event file a run
    upload = SimpleUploadedFile("pets.zip", archive)
    back = client.post(reverse("api-experiments-import"), {"file": upload})
    assert back.status_code == 201, back.content
    body = back.json()
    assert (body["model"], body["dataset"], body["data_path"]) == (
        "resnet18", "imagefolder", FOLDER,
    )  # fmt: skip
    assert body["imported"] is True
    points = SeriesPoint.objects.filter(experiment_id=body["id"]).values_list("key", flat=True)
    assert set(points) == {"train_loss"}  # the fields are no series


def test_a_csv_import_takes_the_fields_from_the_request(client: Client) -> None:
    csv = b"step,train_loss\n1,0.5\n2,0.25\n"
    fields = {"model": "vit_b_16", "dataset": "cifar10"}
    body = client.post(
        reverse("api-experiments-import"),
        {"file": SimpleUploadedFile("run.csv", csv), **fields},
    ).json()
    assert (body["model"], body["dataset"], body["data_path"]) == ("vit_b_16", "cifar10", None)
    plain = client.post(
        reverse("api-experiments-import"), {"file": SimpleUploadedFile("run.csv", csv)}
    ).json()
    assert (plain["model"], plain["dataset"]) == ("simple-cnn", "mnist")
