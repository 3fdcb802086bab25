"""Files a user sends, fuzzed (issue 35: "the fuzz tests gain archives and event files"): valid
seeds (a TensorBoard event file, a zip and a tar.gz of its log folder, a CSV, a code archive),
each mutated as a transfer or a hand would (bytes flipped, cut, repeated, inserted). Whatever
comes out, the import's reader (what its bounded child runs: imports.saved_packed) returns the
series or refuses with ImportRefused, code unpacking with CodeRefused; nothing else escapes, and
neither allocates more than a bound far under a bomb's."""

from __future__ import annotations

import io
import tarfile
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard.experiments.core.archives import ImportRefused
from dashboard.experiments.metrics import imports
from dashboard.experiments.scripts.code import CodeRefused, code_kind, code_unpack
from tests.test_fuzz import FUZZ, SHARE
from tests.test_import import event_file, user_script_log

# Each kind's examples read a file of a few KB: all six kinds' 200 take about 10 s.
FILES = settings(FUZZ, max_examples=max(1, round(200 * SHARE)))
PEAK_MOST = 48 * 1024 * 1024


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes]]:
    folder = tmp_path_factory.mktemp("seed")
    user_script_log(folder / "run")
    events = event_file(folder / "run").read_bytes()
    logs = {"logs/a/events.out.tfevents.1": events, "logs/b/events.out.tfevents.2": events}
    csv = "step,time,train_loss,test_accuracy\n" + "".join(
        f"{s},{s * 0.5},{2.5 / (s + 1)},{0.5 + s / 400}\n" for s in range(60)
    )
    return {
        "tensorboard": ("events.out.tfevents.1", events),
        "zip": ("logs.zip", _zip(logs)),
        "tar.gz": ("logs.tar.gz", _tar_gz(logs)),
        "csv": ("metrics.csv", csv.encode()),
    }


@st.composite
def mutations(draw: Any, data: bytes) -> bytes:
    """`data` changed in one to four places."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(0, len(out) - 1)))
        how = draw(st.sampled_from(["flip", "cut", "repeat", "insert", "truncate"]))
        if how == "flip" and out:
            out[at] ^= draw(st.integers(1, 255))
        elif how == "cut":
            del out[at : at + draw(st.integers(1, 64))]
        elif how == "repeat":
            out[at:at] = out[at : at + draw(st.integers(1, 64))] * draw(st.integers(2, 50))
        elif how == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=32))
        else:
            del out[at:]
    return bytes(out)


def _bounded(call: Any) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        call()
        raised = None
    except (ImportRefused, CodeRefused) as refused:
        raised = refused
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, raised


@pytest.mark.parametrize("kind", ["tensorboard", "zip", "tar.gz", "csv"])
def test_a_mutated_import_is_read_or_refused(
    kind: str, seeds: dict[str, tuple[str, bytes]], tmp_path: Path
) -> None:
    name, seed = seeds[kind]
    counter = iter(range(10**9))

    @FILES
    @given(data=st.data())
    def check(data: Any) -> None:
        content = data.draw(mutations(seed))
        folder = tmp_path / str(next(counter))
        (folder / "scratch").mkdir(parents=True)
        saved = folder / "events.out.tfevents.upload"
        saved.write_bytes(content)
        peak, _ = _bounded(lambda: imports.saved_packed(saved, name, folder / "scratch"))
        assert peak < PEAK_MOST, f"{len(content)} bytes took {peak} to read"

    check()


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_mutated_code_archive_is_unpacked_or_refused(kind: str, tmp_path: Path) -> None:
    files = {"train.py": b"print('hello')\n" * 20, "pkg/__init__.py": b"", "pkg/m.py": b"x = 1\n"}
    seed = _zip(files) if kind == "zip" else _tar_gz(files)
    counter = iter(range(10**9))

    @FILES
    @given(data=st.data())
    def check(data: Any) -> None:
        content = data.draw(mutations(seed))
        root = tmp_path / str(next(counter))

        def unpack() -> None:
            upload = io.BytesIO(content)
            code_unpack(upload=upload, kind=code_kind(upload=upload), root=root)

        peak, _ = _bounded(unpack)
        assert peak < PEAK_MOST, f"{len(content)} bytes took {peak} to unpack"

    check()
