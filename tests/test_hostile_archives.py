"""Archives and files crafted to exhaust the server (issue 35, item 1): each is refused within
the bounds, before it expands, and nothing is stored. Memory is measured with tracemalloc, which
sees the decompressors' output buffers (they are Python bytes)."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile
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
