"""POST /api/experiments/import/: a TensorBoard log written by a user's own script (one event
file, a zip or a tar.gz of the folder) or a CSV becomes a finished run whose series equal the
input; bad, oversized and zip-slip files are refused with nothing created; the imported run
shows on every page a run appears on; export -> import gives the same series back."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from torch.utils.tensorboard import SummaryWriter

from dashboard.accounts.models import ApiToken
from dashboard.experiments.core import archives
from dashboard.experiments.core.descriptions import (
    experiment_option_values,
    experiment_strategy_label,
)
from dashboard.experiments.metrics import imports
from dashboard.experiments.metrics.imports import run_launch_parse
from dashboard.experiments.models import Experiment, SeriesPoint
from tests.factories import float32, logged_in
from training.registry import OPTIONS_DECLARED

pytestmark = pytest.mark.django_db

URL = "/api/experiments/import/"
WALL0 = 1_790_000_000.5
Series = dict[str, list[tuple[int, float, float | None]]]


def series_of(experiment_id: int) -> Series:
    found: Series = {}
    rows = SeriesPoint.objects.filter(experiment_id=experiment_id).order_by("key", "step", "id")
    for point in rows:
        found.setdefault(point.key, []).append((point.step, point.time, point.value))
    return found


def approx_series(series: Series) -> Any:
    return {k: [(s, pytest.approx(t, abs=1e-6), v) for s, t, v in p] for k, p in series.items()}


def user_script_log(folder: Path, *, scale: float = 1.0) -> Series:
    """What a user's own training script writes with SummaryWriter; returns the series the
    import should make of it (values as TensorBoard keeps them: 32-bit floats)."""
    writer = SummaryWriter(log_dir=str(folder))
    expected: Series = {"train_loss": [], "test_accuracy": [], "my/custom": []}
    for step in range(120):
        loss = scale * 2.5 / (step + 1)
        writer.add_scalar("train_loss", loss, step, walltime=WALL0 + step * 0.5)
        expected["train_loss"].append((step, step * 0.5, float32(loss)))
        if step % 40 == 39:
            accuracy = 0.5 + step / 300
            writer.add_scalar("test_accuracy", accuracy, step, walltime=WALL0 + step * 0.5 + 0.1)
            expected["test_accuracy"].append((step, step * 0.5 + 0.1, float32(accuracy)))
    # The new-style scalar (a tensor with the scalars plugin), as TF2 and Keras write them.
    writer.add_scalar("my/custom", 0.125, 7, walltime=WALL0 + 3, new_style=True)
    expected["my/custom"].append((7, 3.0, 0.125))
    writer.close()
    return expected


@pytest.fixture
def client(user_factory: Any) -> Client:
    return logged_in(user_factory(username="alice"))


def upload(client: Client, filename: str, content: bytes, **fields: str) -> Any:
    return client.post(URL, {"file": SimpleUploadedFile(filename, content), **fields})


def event_file(folder: Path) -> Path:
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def zipped(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def test_an_event_file_of_a_users_script_becomes_a_finished_run(
    client: Client, tmp_path: Path
) -> None:
    expected = user_script_log(tmp_path / "run")
    content = event_file(tmp_path / "run").read_bytes()
    response = upload(client, "events.out.tfevents.123.host", content, name="my script")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data == client.get(f"/api/experiments/{data['id']}/").json()
    assert data["name"] == "my script" and data["status"] == "succeeded" and data["imported"]
    run = Experiment.objects.get(pk=data["id"])
    assert run.imported and run.owner.get_username() == "alice" and run.worker == ""
    assert run.started_at is not None and run.started_at.timestamp() == WALL0
    assert run.test_accuracy == pytest.approx(expected["test_accuracy"][-1][2])
    assert series_of(run.pk) == approx_series(expected)


def test_a_zip_of_a_log_folder(client: Client, tmp_path: Path) -> None:
    expected = user_script_log(tmp_path / "logs" / "run1")
    path = event_file(tmp_path / "logs" / "run1")
    content = zipped({"logs/": b"", f"logs/run1/{path.name}": path.read_bytes()})
    response = upload(client, "logs.zip", content)
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "logs"
    assert series_of(response.json()["id"]) == approx_series(expected)


def test_a_tar_gz_of_several_runs_keeps_each_under_its_folder(
    client: Client, tmp_path: Path
) -> None:
    first = user_script_log(tmp_path / "logs" / "a")
    second = user_script_log(tmp_path / "logs" / "b", scale=2.0)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(tmp_path / "logs", arcname="logs")
    response = upload(client, "logs.tar.gz", buffer.getvalue())
    assert response.status_code == 201, response.content
    expected = {f"a/{k}": v for k, v in first.items()} | {f"b/{k}": v for k, v in second.items()}
    assert series_of(response.json()["id"]) == approx_series(expected)


def test_a_wide_csv(client: Client) -> None:
    content = b"step,train_loss,test_accuracy,lr\n0,2.5,,0.001\n1,1.25,,0.001\n2,0.5,0.91,1e-4\n"
    response = upload(client, "mine.csv", content)
    assert response.status_code == 201, response.content
    assert series_of(response.json()["id"]) == {
        "train_loss": [(0, 0.0, 2.5), (1, 0.0, 1.25), (2, 0.0, 0.5)],
        "test_accuracy": [(2, 0.0, 0.91)],
        "lr": [(0, 0.0, 0.001), (1, 0.0, 0.001), (2, 0.0, 1e-4)],
    }
    assert Experiment.objects.get(pk=response.json()["id"]).test_accuracy == 0.91


def test_a_csv_time_column_gives_the_time_and_non_finite_values_are_null(
    client: Client,
) -> None:
    content = "\ufeffstep,time,train_loss\n5,1.5,nan\n6,2.5,0.25\n".encode()
    response = upload(client, "timed.csv", content)
    assert response.status_code == 201, response.content
    assert series_of(response.json()["id"]) == {"train_loss": [(5, 1.5, None), (6, 2.5, 0.25)]}


def test_the_csv_tensorboards_page_downloads_for_one_chart(client: Client) -> None:
    content = b"Wall time,Step,Value\n1790000000.5,0,2.5\n1790000002.0,10,1.25\n"
    response = upload(client, "run-mine-tag-train_loss.csv", content)
    assert response.status_code == 201, response.content
    assert series_of(response.json()["id"]) == {"train_loss": [(0, 0.0, 2.5), (10, 1.5, 1.25)]}
    assert response.json()["started_at"].startswith("2026-09-21T")


def test_export_then_import_gives_the_same_series(
    client: Client, django_user_model: Any, experiment_factory: Any
) -> None:
    from datetime import UTC, datetime

    alice = django_user_model.objects.get(username="alice")
    source = experiment_factory(owner=alice, status="succeeded")
    source.started_at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    source.save()
    keys = ["train_loss", "test_accuracy", "rank/1/images_per_second", "lr"]
    SeriesPoint.objects.bulk_create(
        SeriesPoint(experiment=source, key=k, step=s, time=s * 0.25, value=(i + 1) / (s + 3))
        for i, k in enumerate(keys)
        for s in range(0, 400, i + 1)
    )
    stored = series_of(source.pk)
    for kind in ("tensorboard", "csv"):
        response = client.get(f"/api/experiments/{source.pk}/export/?format={kind}")
        archive = b"".join(response.streaming_content)
        imported = upload(client, f"export.{'zip' if kind == 'tensorboard' else 'csv'}", archive)
        assert imported.status_code == 201, imported.content
        # TensorBoard keeps 32-bit floats; the CSV keeps every digit.
        rounded: Callable[[float], float] = float32 if kind == "tensorboard" else float
        expected: Series = {
            k: [(s, t, None if v is None else rounded(v)) for s, t, v in p]
            for k, p in stored.items()
        }
        assert series_of(imported.json()["id"]) == approx_series(expected)


def nothing_created() -> bool:
    return not Experiment.objects.exists() and not SeriesPoint.objects.exists()


@pytest.mark.parametrize(
    ("name", "content", "status", "reason"),
    [
        ("events.out.tfevents.1", b"\x00\x01garbage" * 50, 400, "no scalar series"),
        ("x.csv", b"step,loss\n1,abc\n", 400, "'abc' is not a number"),
        ("x.csv", b"epoch,loss\n1,2\n", 400, "first column must be `step`"),
        ("x.csv", b"step,loss\n1.5,2\n", 400, "not a whole number"),
        ("x.csv", b"step,loss\n-1,2\n", 400, "not in 0.."),
        ("x.csv", b"step,loss\n1,2,3\n", 400, "3 cells"),
        ("x.csv", b"step,a,a\n1,2,3\n", 400, "distinct"),
        ("x.csv", b"step,loss\n", 400, "no points"),
        ("x.zip", b"PK\x03\x04 truncated", 400, "not a readable zip"),
        ("x.tar.gz", b"\x1f\x8b\x08\x00 truncated", 400, "not a readable tar"),
        ("x.zip", zipped({"notes.txt": b"hi"}), 400, "no TensorBoard event file"),
    ],
)
def test_bad_files_are_refused_with_the_reason_and_nothing_created(
    client: Client, name: str, content: bytes, status: int, reason: str
) -> None:
    response = upload(client, name, content)
    assert response.status_code == status, response.content
    assert reason in response.json()["error"]
    assert nothing_created()


@pytest.mark.parametrize(
    "member", ["../evil/events.out.tfevents.1", "/tmp/events.out.tfevents.1", "a/../../x", "C:\\x"]
)
def test_zip_slip_and_absolute_paths_are_refused(
    client: Client, tmp_path: Path, member: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_script_log(tmp_path / "run")
    content = zipped({member: event_file(tmp_path / "run").read_bytes()})
    monkeypatch.chdir(tmp_path)
    response = upload(client, "evil.zip", content)
    assert response.status_code == 400 and "outside its folder" in response.json()["error"]
    assert nothing_created() and not (tmp_path.parent / "evil").exists()


def test_links_in_a_tar_are_refused(client: Client) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        link = tarfile.TarInfo("logs/events.out.tfevents.1")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    response = upload(client, "logs.tar.gz", buffer.getvalue())
    assert response.status_code == 400 and "is a link" in response.json()["error"]
    assert nothing_created()


def test_oversized_uploads_and_members_get_413(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_BYTES", "1000")
    response = upload(client, "big.csv", b"step,loss\n" + b"1,2\n" * 500)
    assert response.status_code == 413 and "1000 bytes" in response.json()["error"]
    monkeypatch.delenv("TRAINYARD_IMPORT_MAX_BYTES")
    # A member that unpacks to more than the unpacking limit (a zip bomb's shape).
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_UNPACKED_BYTES", "100000")
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("logs/events.out.tfevents.1", b"\x00" * 1_000_000)
    response = upload(client, "bomb.zip", bomb.getvalue())
    assert len(bomb.getvalue()) < 10_000 and response.status_code == 413
    assert "over the 100000 bytes" in response.json()["error"]
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_POINTS", "3")
    response = upload(client, "many.csv", b"step,loss\n1,2\n2,2\n3,2\n4,2\n")
    assert response.status_code == 413 and "over 3 points" in response.json()["error"]
    assert nothing_created()


def test_a_file_at_the_limit_is_taken_with_its_form_fields(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The limit is the file's: the multipart's own bytes around it (boundaries, headers, the
    # name and launch fields) are not the file's. The body was held to the file's limit, so a
    # file at it, or a few hundred bytes under it, was refused with 413 "over the limit".
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_BYTES", "1000")
    content = b"step,loss\n" + b"".join(b"%d,0.5\n" % step for step in range(1, 127))
    content += b"127,0." + b"5" * (1000 - len(content) - 7) + b"\n"
    assert len(content) == 1000
    fields = {"name": "at the limit", "model": "simple-cnn", "dataset": "mnist"}
    response = client.post(URL, {"file": SimpleUploadedFile("at.csv", content), **fields})
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "at the limit"


def test_a_failure_while_storing_leaves_nothing(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(imports, "WRITE_BATCH", 2)
    calls: list[int] = []
    real = SeriesPoint.objects.bulk_create

    def second_batch_fails(batch: list[SeriesPoint]) -> Any:
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(batch)

    monkeypatch.setattr(SeriesPoint.objects, "bulk_create", second_batch_fails)
    with pytest.raises(RuntimeError):
        upload(client, "x.csv", b"step,loss\n1,2\n2,2\n3,2\n4,2\n")
    assert calls == [2, 2] and nothing_created()


def test_who_may_import(user_factory: Any) -> None:
    assert Client().post(URL, {}).status_code == 401
    token = ApiToken.objects.create(user=user_factory(username="script"))
    client = Client(enforce_csrf_checks=True)
    content = SimpleUploadedFile("x.csv", b"step,loss\n1,2\n")
    response = client.post(URL, {"file": content}, HTTP_AUTHORIZATION=f"Bearer {token.key}")
    assert response.status_code == 201 and response.json()["owner"] == "script"
    session = Client(enforce_csrf_checks=True)
    session.force_login(user_factory())
    response = session.post(URL, {"file": SimpleUploadedFile("x.csv", b"step,loss\n1,2\n")})
    assert response.status_code == 403 and "CSRF" in response.json()["error"]
    assert session.get(URL).status_code == 405
    assert Client(enforce_csrf_checks=True).post(
        URL, {}, HTTP_AUTHORIZATION=f"Bearer {token.key}"
    ).json()["errors"] == {"file": ["required"]}


def test_an_imported_run_shows_wherever_runs_do(client: Client, tmp_path: Path) -> None:
    user_script_log(tmp_path / "run")
    content = event_file(tmp_path / "run").read_bytes()
    run_id = upload(client, "events.out.tfevents.9", content, name="from my laptop").json()["id"]
    detail = client.get(f"/experiments/{run_id}/")
    assert detail.status_code == 200 and b"from my laptop" in detail.content
    assert b"Imported from events.out.tfevents.9" in detail.content
    # Its figures came from elsewhere: no Run again (it would launch defaults, not the script).
    assert b'id="imported-badge"' in detail.content and b'id="clone-link"' not in detail.content
    assert b"from my laptop" in client.get("/").content
    compare = client.get(f"/experiments/compare/?ids={run_id}")
    assert compare.status_code == 200 and b"from my laptop" in compare.content
    assert client.get(f"/api/experiments/{run_id}/metrics/").status_code == 200
    listed = client.get("/api/experiments/").json()["experiments"]
    assert [row["id"] for row in listed] == [run_id]


def tar_gz(members: dict[str, bytes], pax: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(content), dict(pax or {})
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def test_a_tar_gz_of_junk_members_is_refused_by_what_it_unpacks_to(
    client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members that are not event files are skipped, but a tar's are decompressed all the same
    to reach the next header: each costs its bytes (a small tar.gz of zeros unpacked ~50 GB)."""
    user_script_log(tmp_path / "run")
    events = event_file(tmp_path / "run").read_bytes()
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_UNPACKED_BYTES", "1000000")
    junk = {f"logs/junk{n}.bin": b"\x00" * 600_000 for n in range(3)}
    content = tar_gz({"logs/events.out.tfevents.1": events, **junk})
    response = upload(client, "junk.tar.gz", content)
    assert len(content) < 20_000 and response.status_code == 413, response.content
    error = response.json()["error"]
    assert "junk1.bin" in error and "over the 1000000 bytes" in error
    assert nothing_created()


def test_a_tar_header_that_unpacks_to_more_than_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tarfile reads a member's extended header whole into memory: the decompressed stream
    itself is capped, not only the members' declared sizes."""
    user_script_log(tmp_path / "run")
    events = event_file(tmp_path / "run").read_bytes()
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_UNPACKED_BYTES", "100000")
    monkeypatch.setattr(archives, "TAR_OVERHEAD_PER_MEMBER", 0)
    content = tar_gz({"logs/events.out.tfevents.1": events}, pax={"comment": "x" * 500_000})
    # The reader in this process, where the patched overhead holds (the route's bounded child
    # has the module as it is).
    refused = saved_refusal(tmp_path, "header.tar.gz", content)
    assert refused.status == 413 and "unpacks to over 100000 bytes" in refused.message


def test_points_are_counted_as_the_event_files_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the points limit in the first folder, the import stops there: the next folder is
    never read."""
    user_script_log(tmp_path / "logs" / "a")
    user_script_log(tmp_path / "logs" / "b")
    read: list[str] = []
    folder_scalars = imports._folder_scalars

    def spied(folder: Path, *args: Any) -> Any:
        read.append(folder.name)
        return folder_scalars(folder, *args)

    monkeypatch.setattr(imports, "_folder_scalars", spied)
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_POINTS", "5")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(tmp_path / "logs", arcname="logs")
    refused = saved_refusal(tmp_path, "logs.tar.gz", buffer.getvalue())
    assert refused.status == 413 and "over 5 points" in refused.message
    assert read == ["a"]


def saved_refusal(tmp_path: Path, name: str, content: bytes) -> archives.ImportRefused:
    """What the import's reader (imports.saved_packed, the bounded child's work) refuses the
    file with, read in this process."""
    saved = tmp_path / "saved"
    saved.write_bytes(content)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(archives.ImportRefused) as refused:
        imports.saved_packed(saved, name, tmp_path / "scratch")
    return refused.value


def test_only_scalars_are_kept_while_reading(tmp_path: Path) -> None:
    """Images, histograms and non-scalar tensors (as TF2 writes images) are dropped as they are
    read; scalars old and new style stay."""
    import numpy as np
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.util import tensor_util

    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.add_scalar("old", 1.0, 0)
    writer.add_scalar("new", 2.0, 0, new_style=True)
    writer.add_histogram("weights", np.arange(10.0), 0)
    writer.add_image("picture", np.zeros((3, 4, 4)), 0)
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="images"))
    tensor = tensor_util.make_tensor_proto(np.zeros((4, 4, 3), dtype=np.float32))
    value = Summary.Value(tag="tf2_picture", metadata=metadata, tensor=tensor)
    writer._get_file_writer().add_summary(Summary(value=[value]), 0)
    writer.close()
    accumulator = imports._scalar_accumulator()(str(tmp_path), imports._PointBudget())
    tags = accumulator.Reload().Tags()
    assert tags["scalars"] == ["old"] and tags["tensors"] == ["new"]
    assert tags["images"] == [] and tags["histograms"] == []
    assert imports._folder_scalars(tmp_path, imports._PointBudget()).keys() == {"old", "new"}


def test_our_export_brings_back_the_strategy_and_its_options(
    client: Client, django_user_model: Any, experiment_factory: Any
) -> None:
    """The TensorBoard export carries the run's strategy, processes and options (the JSON's head
    too); its import takes back those the registry knows, so the run reads as it trained."""
    alice = django_user_model.objects.get(username="alice")
    source = experiment_factory(owner=alice, status="succeeded", strategy="deepspeed", zero_stage=2)
    SeriesPoint.objects.create(experiment=source, key="train_loss", step=1, time=0.5, value=0.25)
    head = json.loads(b"".join(client.get(f"/api/experiments/{source.pk}/export/?format=json")
                               .streaming_content))  # fmt: skip
    assert head["strategy"] == "deepspeed" and head["processes"] == 2
    assert {option.name: head[option.name] for option in OPTIONS_DECLARED} == (
        experiment_option_values(experiment=source)
    )
    archive = b"".join(
        client.get(f"/api/experiments/{source.pk}/export/?format=tensorboard").streaming_content
    )
    imported = upload(client, "export.zip", archive).json()
    assert (imported["strategy"], imported["processes"], imported["zero_stage"]) == (
        "deepspeed", 2, 2,
    )  # fmt: skip
    label = experiment_strategy_label(experiment=source)
    assert imported["strategy_label"] == label == "DeepSpeed ZeRO (ZeRO-2)"


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ({"strategy": "warp-drive", "processes": 2}, {}),
        ({"strategy": ["ddp"], "processes": 2}, {}),
        ({"strategy": "ddp", "processes": True}, {}),
        ({"strategy": "ddp", "processes": 999}, {}),
        ({"strategy": "single", "processes": 4}, {"strategy": "single", "processes": 1}),
        # An option the strategy does not read, or a value it does not take, is left out.
        ({"strategy": "single", "processes": 1, "comm_hook": "fp16"}, {"strategy": "single",
                                                                       "processes": 1}),
        ({"strategy": "deepspeed", "processes": 2, "zero_stage": 3}, {"strategy": "deepspeed",
                                                                      "processes": 2}),
        ({"strategy": "deepspeed", "processes": 2, "zero_stage": True}, {"strategy": "deepspeed",
                                                                         "processes": 2}),
    ],
)  # fmt: skip
def test_only_a_launch_the_registry_knows_is_taken_back(
    written: dict[str, Any], read: dict[str, Any]
) -> None:
    assert run_launch_parse(written) == read
