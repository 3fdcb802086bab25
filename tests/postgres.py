"""A PostgreSQL server of the test's own: Debian's binaries, a temporary folder, a free port.

`initdb` refuses to run as root, so as root the server runs as the `postgres` user that Debian's
package creates (shared/PITFALLS.md). Trust authentication on the addresses it listens on: it
lives only as long as the test and holds only test data.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def postgres_bin() -> Path | None:
    """Debian's server binaries (package postgresql), newest version first; None without them.
    TRAINYARD_POSTGRES_LIB: the folder of versions, as in .ci/system-packages."""
    versions = os.environ.get("TRAINYARD_POSTGRES_LIB") or "/usr/lib/postgresql"
    found = sorted(glob.glob(f"{versions}/*/bin/initdb"), reverse=True)
    return Path(found[0]).parent if found else None


def _as_server_user(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


@dataclass
class Postgres:
    host: str
    port: int
    folder: Path

    def url(self, database: str) -> str:
        return f"postgres://postgres@{self.host}:{self.port}/{database}"

    def database_create(self, name: str) -> str:
        binary = postgres_bin()
        assert binary is not None
        where = ["-h", self.host, "-p", str(self.port), "-U", "postgres"]
        subprocess.run(
            [str(binary / "createdb"), *where, name], check=True, capture_output=True, timeout=60
        )
        return self.url(name)


@contextlib.contextmanager
def postgres_running(*, port: int, listen: str = "127.0.0.1") -> Iterator[Postgres]:
    """A server on `listen`:`port` (comma-separated addresses), its data in a folder of its own
    under $TMPDIR (the server user must reach it: pytest's tmp_path is root's alone); stopped and
    deleted afterwards."""
    binary = postgres_bin()
    if binary is None:
        raise RuntimeError("PostgreSQL's server is not installed (Debian package postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="trainyard-pg-"))
    folder.chmod(0o755)
    data = folder / "pgdata"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        _as_server_user([str(binary / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    options = f"-p {port} -k {data} -c listen_addresses={listen} -c fsync=off"
    ctl = [str(binary / "pg_ctl"), "-D", str(data), "-l", str(data / "server.log")]
    subprocess.run(
        _as_server_user([*ctl, "-o", options, "-w", "start"]),
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    try:
        yield Postgres(host=listen.split(",")[0], port=port, folder=data)
    finally:
        subprocess.run(_as_server_user([*ctl, "-m", "immediate", "stop"]), check=False,
                       capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
