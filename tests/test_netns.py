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
from pathlib import Path

import pytest

from tests.conftest import need
from tests.netns import machines, namespaces_unavailable
from tests.stack import wait_for

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
