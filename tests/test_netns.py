"""The test machines of tests/netns.py are real hosts to torchrun: a 2-node Gloo job across them.

This is what the multi-machine runs stand on (shared/PITFALLS.md, "Several machines"): torchrun's
c10d rendezvous hosted on the first machine (`is_host`), each node binding its own address
(`--local-addr`), Gloo on the namespace's interface.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.conftest import need
from tests.netns import machines, namespaces_unavailable
from tests.stack import ROOT, wait_for

ALL_REDUCE = """
import json, os
from datetime import timedelta
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item(),
                  "netns": os.readlink("/proc/self/ns/net")}), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def two_machines():  # type: ignore[no-untyped-def]
    reason = namespaces_unavailable()
    need(reason is None, f"no test machines: {reason}")
    with machines(2) as network:
        yield network


def test_machines_reach_each_other_and_the_host(two_machines) -> None:  # type: ignore[no-untyped-def]
    first, second = two_machines.machines
    with socket.create_server((two_machines.host_address, 0)) as server:
        port = server.getsockname()[1]
        assert first.can_reach(two_machines.host_address, port)
        assert second.can_reach(two_machines.host_address, port)
        # Cut off, a machine reaches nobody, and nobody reaches it.
        first.link_set(up=False)
        assert not first.can_reach(two_machines.host_address, port)
        first.link_set(up=True)
        # Back up, the link needs a moment (carrier, neighbour discovery) before traffic flows.
        wait_for(
            lambda: first.can_reach(two_machines.host_address, port),
            timeout=20, what="the machine reconnected",
        )  # fmt: skip
    listener = second.popen(
        ["/usr/bin/python3", "-c",
         f"import socket; s = socket.create_server(({second.address!r}, 7777)); "
         "print('ready', flush=True); s.accept()"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        assert first.can_reach(second.address, 7777)
    finally:
        listener.kill()
        listener.wait()


def test_a_two_node_gloo_job_runs_one_rank_on_each_machine(two_machines, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    first = two_machines.machines[0]
    endpoint = f"{first.address}:{random.randint(29400, 29999)}"
    nodes = []
    for index, machine in enumerate(two_machines.machines):
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "netns-test", "--rdzv-conf", f"is_host={str(index == 0).lower()}",
            "--local-addr", machine.address, str(script),
        ]  # fmt: skip
        env = {"GLOO_SOCKET_IFNAME": "eth0", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
        with_env = ["env", *(f"{k}={v}" for k, v in env.items()), *command]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        nodes.append(machine.popen(with_env, **pipes))
    outputs = [node.communicate(timeout=180) for node in nodes]
    for node, (_out, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    results = [json.loads(line) for out, _ in outputs for line in out.splitlines() if "{" in line]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert {r["sum"] for r in results} == {3.0} and {r["world"] for r in results} == {2}
    # Each rank ran in its own machine's network namespace.
    spaces = {r["rank"]: r["netns"] for r in results}
    assert spaces[0] != spaces[1]


HOLD_LOCK = """
import sys, time
import psycopg
from dashboard.settings import database_settings

db = database_settings(sys.argv[1])
connection = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                             dbname=db["NAME"], **db["OPTIONS"])
connection.execute("SELECT id FROM held WHERE id = 1 FOR UPDATE")  # a transaction left open
print("locked", flush=True)
time.sleep(600)
"""


def test_a_machine_cut_off_inside_a_transaction_frees_its_row_locks(two_machines) -> None:  # type: ignore[no-untyped-def]
    """A worker cut off between two statements of a transaction (Django's update_or_create, a
    claim's row locks) must not hold its locks on the server: PostgreSQL would wait for the dead
    client for TCP's two hours, and every claim would wait behind it. The session's own
    keepalive settings (dashboard/settings.py) end it on the server within seconds."""
    from dashboard.serving import free_port
    from tests.machines_cluster import postgres_open_to
    from tests.postgres import postgres_bin, postgres_running

    need(postgres_bin() is not None, "PostgreSQL's server is not installed")
    network, machine = two_machines, two_machines.machines[0]
    listen = f"127.0.0.1,{network.host_address}"
    with postgres_running(port=free_port(), listen=listen) as postgres:
        postgres_open_to(postgres, network)
        url = postgres.database_create("locks")
        with psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True) as db:
            db.execute("CREATE TABLE held (id int PRIMARY KEY); INSERT INTO held VALUES (1)")
        remote = url.replace("@127.0.0.1:", f"@{network.host_address}:")
        holder = machine.popen([sys.executable, "-c", HOLD_LOCK, remote],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            machine.link_set(up=False)
            cut_at = time.monotonic()
            wait_for(lambda: _lock_free(url), timeout=60, interval=1,
                     what="the cut-off client's row lock freed on the server")  # fmt: skip
            print(f"cut to lock freed: {time.monotonic() - cut_at:.1f} s")
        finally:
            holder.kill()
            holder.wait()
            machine.link_set(up=True)


def _lock_free(url: str) -> bool:
    with psycopg.connect(url.replace("postgres://", "postgresql://")) as db:
        try:
            db.execute("SELECT id FROM held WHERE id = 1 FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return False
    return True
