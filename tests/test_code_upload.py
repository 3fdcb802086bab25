"""POST /api/code/: a folder of a user's own code, as a .tar.gz or a .zip, kept once by its hash
(the same content again is the same id), for those allowed to run scripts only; archives that
reach outside their folder, hold links or devices, or pass a bound are refused with the reason,
and nothing is kept."""

from __future__ import annotations

import hashlib
import io
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from dashboard.experiments.core import archives
from dashboard.experiments.core.access import script_allowed
from dashboard.experiments.models import CodeArchive
from tests.factories import logged_in

pytestmark = pytest.mark.django_db
URL = "/api/code/"

# A user's folder: a torchrun script of their own, a module beside it, its requirements.
FOLDER = {
    "train.py": (
        "import torch.distributed as dist\n"
        "from lib.model import Net\n\n"
        "if __name__ == '__main__':\n"
        "    dist.init_process_group('gloo')\n"
        "    print(Net())\n"
    ),
    "lib/model.py": "from torch import nn\n\nclass Net(nn.Linear):\n    def __init__(self):\n"
    "        super().__init__(4, 2)\n",
    "requirements.txt": "torch\n",
}


def tar_gz(members: dict[str, bytes | str], extra: list[tarfile.TarInfo] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, content in members.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra or []:
            archive.addfile(info)
    return out.getvalue()


def zipped(members: dict[str, bytes | str], links: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return out.getvalue()


def upload(client: Client, data: bytes, name: str = "code.tar.gz") -> Any:
    return client.post(URL, {"archive": SimpleUploadedFile(name, data)})


@pytest.fixture
def code_dir(settings: Any, tmp_path: Path) -> Path:
    settings.TRAINYARD_CODE_DIR = tmp_path / "code"
    return settings.TRAINYARD_CODE_DIR


def allowed(user: Any) -> Any:
    """A user granted experiments.run_script in the admin."""
    user.user_permissions.add(Permission.objects.get(codename="run_script"))
    return user


def test_a_folder_is_kept_once_by_its_hash_and_the_same_upload_is_the_same_id(
    user_factory: Any, code_dir: Path
) -> None:
    alice = logged_in(allowed(user_factory(username="alice")))
    archive = tar_gz(FOLDER)
    first = upload(alice, archive)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body == {
        "id": body["id"],
        "sha256": hashlib.sha256(archive).hexdigest(),
        "bytes": len(archive),
        "files": 3,
    }
    kept = code_dir / f"{body['sha256']}.tar.gz"
    assert kept.read_bytes() == archive
    row = CodeArchive.objects.get(pk=body["id"])
    assert (row.kind, row.unpacked_bytes) == ("tar.gz", sum(len(c) for c in FOLDER.values()))

    again = upload(alice, archive, name="renamed.tgz")
    assert (again.status_code, again.json()) == (201, body)
    # The same folder as a zip is other bytes: its own id and file.
    as_zip = upload(alice, zipped(FOLDER), name="code.zip")
    assert as_zip.status_code == 201 and as_zip.json()["id"] != body["id"]
    assert as_zip.json()["files"] == 3
    # Another user's upload of the same bytes is theirs (a row of their own), kept once on disk.
    bob = logged_in(allowed(user_factory(username="bob")))
    theirs = upload(bob, archive)
    assert theirs.status_code == 201 and theirs.json()["id"] != body["id"]
    assert CodeArchive.objects.count() == 3
    assert sorted(path.name for path in code_dir.iterdir()) == sorted(
        [kept.name, f"{as_zip.json()['sha256']}.zip"]
    )


def test_only_those_allowed_to_run_scripts_may_upload(user_factory: Any, code_dir: Path) -> None:
    archive = tar_gz(FOLDER)
    refused = upload(logged_in(user_factory()), archive)
    assert refused.status_code == 403
    assert "experiments.run_script" in refused.json()["error"]
    assert upload(Client(), archive).status_code == 401
    assert not CodeArchive.objects.exists() and not code_dir.exists()
    assert upload(logged_in(user_factory(staff=True)), archive).status_code == 201


def _link(kind: bytes, name: str = "lib/evil", target: str = "/etc/passwd") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _folder(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def _device() -> tarfile.TarInfo:
    info = tarfile.TarInfo("dev/null")
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info


def _pax(name: str, headers: dict[str, str]) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.pax_headers = headers
    return info


def pax_tar_gz(infos: list[tarfile.TarInfo]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for info in infos:
            archive.addfile(info, io.BytesIO(b""))
    return out.getvalue()


def zipped_modes(modes: dict[str, int]) -> bytes:
    """A zip whose members carry these Unix modes (a FIFO, a device: what a zip may claim)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("train.py", FOLDER["train.py"])
        for name, mode in modes.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, b"")
    return out.getvalue()


BIG = {"train.py": "x = 1\n" * 1000}  # 6,000 bytes unpacked, far fewer packed
BAD = {
    "a path up and out": (tar_gz({**FOLDER, "../outside.py": "x"}), "points outside its folder"),
    "a path up and out, zipped": (zipped({"../../outside.py": "x"}), "points outside its folder"),
    "an absolute path": (tar_gz({"/etc/cron.d/job": "x"}), "points outside its folder"),
    "an absolute path, zipped": (zipped({"/tmp/x.py": "x"}), "points outside its folder"),
    "a symbolic link": (tar_gz(FOLDER, [_link(tarfile.SYMTYPE)]), "is a link"),
    "a hard link": (tar_gz(FOLDER, [_link(tarfile.LNKTYPE, target="train.py")]), "is a link"),
    "a link, zipped": (zipped(FOLDER, {"lib/evil": "/etc/passwd"}), "is a link"),
    "a device": (tar_gz(FOLDER, [_device()]), "is a device"),
    "not an archive": (b"#!/bin/sh\nrm -rf /\n", "neither a .tar.gz nor a .zip"),
    "a broken gzip": (tar_gz(FOLDER)[:40], "not a readable tar archive"),
    "a broken zip": (zipped(FOLDER)[:60], "not a readable zip"),
    "no files": (tar_gz({}, [_folder("empty")]), "holds no files"),
    "over the files bound": (tar_gz({f"m{i}.py": "x" for i in range(6)}), "over 5 members"),
    "over the unpacked bound": (tar_gz(BIG), "unpacks to"),
    "over the unpacked bound, zipped": (zipped(BIG), "over the 5000 bytes"),
    "a NUL in a name": (pax_tar_gz([_pax("a.py", {"path": "lib/a\x00b.py"})]), "control character"),
    "a tree too deep": (tar_gz({"a/" * 70 + "f.py": "x"}), "folders deep"),
    "a name part too long": (tar_gz({"x" * 300 + ".py": "x"}), "bytes a part"),
    # 250 KB packed, a 50 MB header unpacked: tarfile reads a pax header whole.
    "a huge header": (
        pax_tar_gz([_pax("a.py", {"comment": "z" * 50_000_000})]),
        "a header of over",
    ),
    "a fifo, zipped": (zipped_modes({"pipe": stat.S_IFIFO | 0o644}), "is a device"),
    "a device, zipped": (zipped_modes({"dev/null": stat.S_IFCHR | 0o666}), "is a device"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_archive_is_refused_with_the_reason_and_nothing_is_kept(
    case: str, user_factory: Any, code_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_CODE_MAX_FILES", "5")
    monkeypatch.setenv("TRAINYARD_CODE_MAX_UNPACKED_BYTES", "5000")
    data, reason = BAD[case]
    response = upload(logged_in(allowed(user_factory())), data)
    # Over a size bound, as an import over one: a 413.
    assert response.status_code == (413 if "unpacked" in case else 400), response.content
    assert reason in response.json()["error"]
    assert not CodeArchive.objects.exists()
    assert not code_dir.exists() or not any(code_dir.iterdir())


def test_an_archive_over_the_size_taken_or_no_archive_is_refused(
    user_factory: Any, code_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = logged_in(allowed(user_factory()))
    missing = client.post(URL, {"file": SimpleUploadedFile("code.tar.gz", tar_gz(FOLDER))})
    assert missing.status_code == 400 and missing.json()["errors"] == {"archive": ["required"]}
    monkeypatch.setenv("TRAINYARD_CODE_MAX_BYTES", "100")
    response = upload(client, tar_gz(BIG))
    assert response.status_code == 413 and "over the 100 bytes taken" in response.json()["error"]
    assert not CodeArchive.objects.exists() and not code_dir.exists()


def test_the_admin_grants_the_permission_and_lists_the_uploads(
    user_factory: Any, code_dir: Path, django_user_model: Any
) -> None:
    admin = django_user_model.objects.create_superuser("root", password="pw-root")
    client = logged_in(admin)
    carol = user_factory(username="carol")
    page = client.get(f"/admin/auth/user/{carol.pk}/change/").content.decode()
    assert "Can upload code and launch a script run" in page
    code = upload(logged_in(allowed(carol)), tar_gz(FOLDER)).json()
    listed = client.get("/admin/experiments/codearchive/").content.decode()
    assert code["sha256"] in listed and "carol" in listed
    assert client.get("/admin/experiments/codearchive/add/").status_code == 403


def test_a_zip_of_too_many_members_is_refused_before_zipfile_reads_them(
    user_factory: Any, code_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zipfile builds an entry per member of the directory before the first can be checked:
    the directory is counted first."""
    monkeypatch.setenv("TRAINYARD_CODE_MAX_FILES", "5")
    nine = zipped({f"m{i}.py": "" for i in range(9)})
    opened: list[Any] = []
    monkeypatch.setattr(archives.zipfile, "ZipFile", lambda *a, **k: opened.append(a))
    response = upload(logged_in(allowed(user_factory())), nine)
    assert response.status_code == 400 and "over 5 members" in response.json()["error"]
    assert opened == []


def test_one_without_the_permission_is_refused_before_the_body_is_read(
    user_factory: Any, code_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's post is read by its CSRF check before the view runs: the permission is asked
    first, so the answer is the 403, not the size's 400, and nothing is received."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_factory())
    assert client.get("/experiments/new/").status_code == 200  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    monkeypatch.setenv("TRAINYARD_CODE_MAX_BYTES", "100")
    archive = SimpleUploadedFile("code.tar.gz", tar_gz(BIG))
    response = client.post(URL, {"archive": archive}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 403 and "run_script" in response.json()["error"]


def test_a_kept_archive_is_readable_whole_and_kept_again_where_it_was_lost(
    user_factory: Any, code_dir: Path
) -> None:
    client = logged_in(allowed(user_factory()))
    archive = tar_gz({**FOLDER, "lib/model.py": "a = 1\n"} | {"lib/model.py": "a = 2\n"})
    body = upload(client, archive).json()
    kept = code_dir / f"{body['sha256']}.tar.gz"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644  # the workers' user reads it too
    kept.write_bytes(archive[:50])  # cut short (a crash before this fix's fsync)
    assert upload(client, archive).json() == body
    assert kept.read_bytes() == archive
    kept.unlink()
    assert upload(client, archive).json() == body and kept.read_bytes() == archive
    assert not [path for path in code_dir.iterdir() if path.name.startswith(".upload-")]


def test_a_member_named_twice_is_one_file(user_factory: Any, code_dir: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for data in (b"old", b"newer"):
            info = tarfile.TarInfo("train.py")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    body = upload(logged_in(allowed(user_factory())), out.getvalue()).json()
    assert body["files"] == 1
    assert CodeArchive.objects.get(pk=body["id"]).unpacked_bytes == len(b"newer")


def test_an_inactive_user_may_not_run_scripts(user_factory: Any) -> None:
    staff = user_factory(staff=True)
    assert script_allowed(user=staff)
    staff.is_active = False
    assert not script_allowed(user=staff)
