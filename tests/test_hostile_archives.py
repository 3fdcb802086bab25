"""Archives and files crafted to exhaust the server (issue 35, item 1): each is refused within
the bounds, before it expands, and nothing is stored. Memory is measured with tracemalloc, which
sees the decompressors' output buffers (they are Python bytes)."""

from __future__ import annotations

import io
import struct
import tarfile
import tracemalloc
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile

from dashboard.experiments.core import archives
from dashboard.experiments.models import CodeArchive, Experiment, SeriesPoint
from tests.factories import logged_in

EXPANDED = 32 * 1024 * 1024  # what a bomb's member unpacks to
PEAK_MOST = 4 * 1024 * 1024  # what refusing it may cost


def _lying_zip(method: int, name: str = "logs/events.out.tfevents.1") -> bytes:
    """A zip of one member of EXPANDED zero bytes, compressed by `method`, whose headers say it
    unpacks to 10 bytes: a few KB that a reader trusting them would expand to EXPANDED."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        archive.writestr(name, b"\x00" * EXPANDED)
    data = bytearray(buffer.getvalue())
    local, central = data.find(b"PK\x03\x04"), data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, 10)
    struct.pack_into("<I", data, central + 24, 10)
    return bytes(data)


BOMBS = {"bzip2": zipfile.ZIP_BZIP2, "LZMA": zipfile.ZIP_LZMA}


def _peak(call: Callable[[], Any]) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        call()
        raised = None
    except Exception as exc:  # what the call refused with, checked by the test
        raised = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


@pytest.mark.parametrize("method", BOMBS.values(), ids=BOMBS.keys())
def test_a_zip_of_bzip2_or_lzma_members_is_refused_before_it_expands(
    method: int, tmp_path: Path
) -> None:
    bomb = _lying_zip(method)
    assert len(bomb) < 16_000  # a few KB
    peak, raised = _peak(
        lambda: archives.zip_unpack(source=io.BytesIO(bomb), root=tmp_path / "out")
    )
    assert peak < PEAK_MOST, f"refusing took {peak} bytes"
    assert isinstance(raised, archives.ImportRefused), raised
    assert raised.status == 400
    assert "'logs/events.out.tfevents.1'" in raised.message
    assert "stored or deflate" in raised.message
    assert not list((tmp_path / "out").rglob("*"))


@pytest.mark.django_db
@pytest.mark.parametrize("method", BOMBS.values(), ids=BOMBS.keys())
def test_the_import_route_refuses_a_bzip2_or_lzma_zip_and_stores_nothing(
    method: int, user_factory: Any
) -> None:
    client = logged_in(user_factory(username="alice"))
    upload = SimpleUploadedFile("logs.zip", _lying_zip(method))
    response = client.post("/api/experiments/import/", {"file": upload})
    assert response.status_code == 400, response.content
    assert "stored or deflate" in response.json()["error"]
    assert not Experiment.objects.exists() and not SeriesPoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("method", BOMBS.values(), ids=BOMBS.keys())
def test_a_code_upload_of_a_bzip2_or_lzma_zip_is_refused_and_nothing_kept(
    method: int, user_factory: Any, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD_CODE_DIR = tmp_path / "code"
    alice = user_factory(username="alice")
    alice.user_permissions.add(Permission.objects.get(codename="run_script"))
    upload = SimpleUploadedFile("code.zip", _lying_zip(method, name="train.py"))
    response = logged_in(alice).post("/api/code/", {"archive": upload})
    assert response.status_code == 400, response.content
    assert "'train.py'" in response.json()["error"]
    assert not CodeArchive.objects.exists() and not (tmp_path / "code").exists()


def _event_file_declaring(folder: Path, dims: list[int], **values: Any) -> bytes:
    """A TensorBoard event file of one scalars-plugin tensor declaring `dims` but holding
    `values` (one float: TensorBoard's make_ndarray repeats it to the declared shape)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.compat.proto.types_pb2 import DT_FLOAT
    from torch.utils.tensorboard import SummaryWriter

    shape = TensorShapeProto(dim=[TensorShapeProto.Dim(size=size) for size in dims])
    tensor = TensorProto(dtype=DT_FLOAT, tensor_shape=shape, **values)
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    writer = SummaryWriter(log_dir=str(folder))
    writer.add_scalar("loss", 1.0, 0)
    value = Summary.Value(tag="huge", metadata=metadata, tensor=tensor)
    writer._get_file_writer().add_summary(Summary(value=[value]), 1)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path.read_bytes()


def test_a_tensorboard_tensor_declaring_a_huge_shape_is_refused_before_it_is_made(
    tmp_path: Path,
) -> None:
    from dashboard.experiments.metrics import imports

    plain = _event_file_declaring(tmp_path / "plain", [], float_val=[1.0])
    data = _event_file_declaring(tmp_path / "log", [EXPANDED // 4], float_val=[1.0])
    assert len(data) < 1_000
    # What reading any event file costs (TensorBoard's reader buffers 16 MiB), with its modules
    # imported: the hostile file may cost no more than that and PEAK_MOST.
    usual, _ = _peak(lambda: imports.tensorboard_read(files=list((tmp_path / "plain").iterdir())))
    assert len(plain) < 1_000
    peak, raised = _peak(lambda: imports.tensorboard_read(files=list((tmp_path / "log").iterdir())))
    assert peak < usual + PEAK_MOST, f"refusing took {peak} bytes, reading {usual}"
    assert isinstance(raised, archives.ImportRefused), raised
    assert raised.status == 400 and "'huge'" in raised.message
    assert f"declares {EXPANDED // 4} values" in raised.message


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("dims", "values"),
    [([EXPANDED // 4], {"float_val": [1.0]}), ([], {}), ([2, -1], {"float_val": [1.0]})],
    ids=["huge", "empty", "negative"],
)
def test_the_import_route_refuses_a_tensor_that_is_no_scalar_and_stores_nothing(
    dims: list[int], values: dict[str, Any], user_factory: Any, tmp_path: Path
) -> None:
    client = logged_in(user_factory(username="alice"))
    data = _event_file_declaring(tmp_path, dims, **values)
    upload = SimpleUploadedFile("events.out.tfevents.1", data)
    response = client.post("/api/experiments/import/", {"file": upload})
    assert response.status_code == 400, response.content
    assert "'huge'" in response.json()["error"]
    assert not Experiment.objects.exists() and not SeriesPoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("filename", "content", "reason"),
    [
        ("wide.csv", b"step,a,b,c,d\n1,1,2,3,4\n", "over 3 series"),
        (
            "long.csv",
            b"key,step,time,value\n" + b"".join(b"s%d,1,0,1\n" % i for i in range(4)),
            "over 3 series",
        ),
        ("tb.csv", b"step,loss\n" + b"1,2\n" * 5, "5 points at step 1, over the 4"),
        ("tb.csv", b"step,loss\n" + b"1,2\n" * 4, ""),
    ],
    ids=["wide", "long", "one step", "at the bound"],
)
def test_an_import_is_bounded_in_series_and_points_a_step(
    filename: str, content: bytes, reason: str, user_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_SERIES", "3")
    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_POINTS_PER_STEP", "4")
    client = logged_in(user_factory(username="alice"))
    response = client.post(
        "/api/experiments/import/", {"file": SimpleUploadedFile(filename, content)}
    )
    if not reason:
        assert response.status_code == 201, response.content
        return
    assert response.status_code == 400, response.content
    assert reason in response.json()["error"]
    assert not Experiment.objects.exists() and not SeriesPoint.objects.exists()


@pytest.mark.django_db
def test_a_zip_of_event_files_with_too_many_series_is_refused(
    user_factory: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_SERIES", "3")
    writer = SummaryWriter(log_dir=str(tmp_path / "logs"))
    for tag in ("a", "b", "c", "d"):
        writer.add_scalar(tag, 1.0, 0)
    writer.close()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in (tmp_path / "logs").iterdir():
            archive.write(path, f"logs/{path.name}")
    client = logged_in(user_factory(username="alice"))
    upload = SimpleUploadedFile("logs.zip", buffer.getvalue())
    response = client.post("/api/experiments/import/", {"file": upload})
    assert response.status_code == 400 and "over 3 series" in response.json()["error"]
    assert not Experiment.objects.exists() and not SeriesPoint.objects.exists()


def test_a_csv_of_one_huge_line_is_refused_without_splitting_it(tmp_path: Path) -> None:
    """A header of a million columns (8 MB): refused having read no more than a line's bound,
    never split into a million cells."""
    from dashboard.experiments.metrics import imports

    header = "step," + ",".join(f"s{i:06d}" for i in range(1_000_000)) + "\n1\n"
    saved = tmp_path / "wide.csv"
    saved.write_text(header)
    # The reader itself, here where tracemalloc sees it (the route runs it in a bounded child).
    peak, raised = _peak(lambda: imports.saved_read(saved, "wide.csv", tmp_path))
    assert peak < PEAK_MOST, f"refusing took {peak} bytes"
    assert isinstance(raised, archives.ImportRefused) and raised.status == 400, raised
    assert "CSV line 1 is over" in raised.message


def _tar(mode: str, members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _xz_declaring_a_4_gib_dictionary(data: bytes) -> bytes:
    """An .xz whose one block's header declares LZMA2's largest dictionary (4 GiB), with its
    CRC made good: liblzma allocates the dictionary a header declares before it decodes."""
    xz = bytearray(data)
    size = (xz[12] + 1) * 4  # the block header, after the 12-byte stream header
    header = xz[12 : 12 + size]
    props = header.find(b"\x21\x01") + 2  # the LZMA2 filter's one property byte
    header[props] = 40
    header[-4:] = struct.pack("<I", zlib.crc32(bytes(header[:-4])))
    xz[12 : 12 + size] = header
    return bytes(xz)


def test_an_xz_declaring_a_huge_dictionary_is_refused_before_it_is_allocated(
    tmp_path: Path,
) -> None:
    bomb = _xz_declaring_a_4_gib_dictionary(_tar("w:xz", {"events.out.tfevents.1": b"x" * 100}))
    peak, raised = _peak(lambda: archives.tar_unpack(source=io.BytesIO(bomb), root=tmp_path))
    assert peak < PEAK_MOST, f"refusing took {peak} bytes"
    assert isinstance(raised, archives.ImportRefused) and raised.status == 400, raised
    assert "memory" in raised.message


@pytest.mark.parametrize("mode", ["w:xz", "w:bz2", "w:gz"])
def test_a_tar_of_each_compression_still_unpacks(mode: str, tmp_path: Path) -> None:
    members = {f"logs/events.out.tfevents.{i}": bytes([i]) * 300_000 for i in range(3)}
    (path, *_) = files = archives.tar_unpack(source=io.BytesIO(_tar(mode, members)), root=tmp_path)
    assert sorted(p.read_bytes() for p in files) == sorted(members.values())
    assert path.is_relative_to(tmp_path)


@pytest.mark.django_db
def test_an_event_record_over_the_bound_is_refused_before_it_is_parsed(
    user_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TensorBoard record is parsed whole, at about 9 times its bytes (measured: 92 MB of
    memory for a 10 MB record of a million values): one over the record bound is refused by
    its length, read from its header, before any record is handed to the parser."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setenv("TRAINYARD_IMPORT_MAX_RECORD_BYTES", "100000")
    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.add_scalar("loss", 1.0, 0)
    values = [Summary.Value(tag=f"v{i}", simple_value=1.0) for i in range(20_000)]
    writer._get_file_writer().add_summary(Summary(value=values), 1)
    writer.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    parsed: list[int] = []
    load = event_file_loader.RawEventFileLoader.Load

    def spied(self: Any) -> Any:
        for record in load(self):
            parsed.append(len(record))
            yield record

    monkeypatch.setattr(event_file_loader.RawEventFileLoader, "Load", spied)
    client = logged_in(user_factory(username="alice"))
    upload = SimpleUploadedFile(path.name, path.read_bytes())
    response = client.post("/api/experiments/import/", {"file": upload})
    assert max(parsed, default=0) <= 100_000, f"a record of {max(parsed)} bytes was parsed"
    assert response.status_code == 400, response.content
    assert "over 100000 bytes" in response.json()["error"]
    assert not Experiment.objects.exists() and not SeriesPoint.objects.exists()
