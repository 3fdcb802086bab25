"""The training launcher across machines: `python -m training --nnodes 2 ...` on two machines
(network namespaces of tests/netns.py) runs one DDP job through torchrun's c10d rendezvous, and
ends with the parameters of the same job on one machine (same seed, same global batch)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.netns import machines, namespaces_unavailable
from tests.test_exactness import assert_same_parameters
from tests.test_training import run_cli
from training.config import parse_args
from training.process.torchrun import torchrun_rendezvous

ROOT = Path(__file__).resolve().parent.parent
JOB = (
    "--strategy", "ddp", "--nproc", "1", "--batch-size", "32", "--optimizer", "sgd",
    "--lr", "0.01", "--seed", "7", "--epochs", "1", "--steps-per-epoch", "8",
    "--log-interval", "4",
)  # fmt: skip


def test_one_machine_stays_standalone() -> None:
    cfg = parse_args(["--strategy", "ddp", "--nproc", "2"])
    assert torchrun_rendezvous(cfg) == ["--standalone"]


def test_several_machines_take_the_c10d_rendezvous() -> None:
    cfg = parse_args(
        ["--strategy", "ddp", "--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:29400",
         "--rdzv-id", "trainyard-7-1", "--rdzv-host", "--local-addr", "10.0.0.1"]
    )  # fmt: skip
    assert torchrun_rendezvous(cfg) == [
        "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=trainyard-7-1", "--rdzv-conf=is_host=true", "--max-restarts=0",
        "--local-addr=10.0.0.1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--nnodes", "2"], "several machines need --rdzv-endpoint and --rdzv-id"),
        (["--rdzv-id", "x"], "--rdzv-id: only with --nnodes 2 or more"),
        (["--nnodes", "2", "--rdzv-endpoint", "host", "--rdzv-id", "x"], "expected HOST:PORT"),
        (["--nnodes", "2", "--strategy", "single"], "runs on one machine"),
    ],
)
def test_refusals_say_why(args: list[str], said: str) -> None:
    command = [sys.executable, "-m", "training", "--strategy", "ddp", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    assert said in done.stderr


def test_two_machines_equal_one_machine_with_two_ranks(sample_data: Path, tmp_path: Path) -> None:
    reason = namespaces_unavailable()
    need(reason is None, f"no test machines: {reason}")
    one = run_cli(sample_data, *JOB[:3], "2", *JOB[4:], "--checkpoint-dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    with machines(2) as network:
        endpoint = f"{network.machines[0].address}:{random.randint(29400, 29999)}"
        nodes = []
        for index, machine in enumerate(network.machines):
            flags = ["--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", "launcher-test",
                     "--local-addr", machine.address]  # fmt: skip
            flags += ["--rdzv-host"] if index == 0 else []
            command = [
                "env", f"TRAINYARD_WORKER_NAME={machine.name}", "TRAINYARD_NO_DOWNLOAD=1",
                sys.executable, "-m", "training",
                *JOB, *flags, "--data-dir", str(sample_data),
                "--checkpoint-dir", str(tmp_path / f"node{index}"),
            ]  # fmt: skip
            nodes.append(
                machine.popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
                )  # fmt: skip
            )
        outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    events = [json.loads(line) for out, _ in outputs for line in out.splitlines() if "{" in line]
    (started,) = [e for e in events if e["type"] == "started"]  # rank 0 alone writes events
    assert started["world_size"] == 2 and started["global_batch_size"] == 64
    assert sorted(started["machines"]) == sorted(m.name for m in network.machines)
    written = [p for p in tmp_path.glob("node*/epoch-1.pt")]
    assert len(written) == 1  # global rank 0's node alone checkpoints
    assert_same_parameters(written[0], tmp_path / "one" / "epoch-1.pt", rtol=1e-5)
