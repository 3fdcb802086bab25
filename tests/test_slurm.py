"""Slurm as the backend, end to end: a real two-node cluster on this host (tests/slurm_cluster.py)
and a stack whose web server, worker and beat have TRAINYARD_SLURM on. Runs go in through the
API as a user's would, and the cluster is read back with its own commands.

One cluster and one stack for the module (per test worker), and as few trainings as the checks
allow: the nodes have one CPU each, so a run over both holds the whole cluster.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from dashboard.experiments.runs.process import training_popen
from dashboard.experiments.runs.slurm.step import SlurmStepProcess
from dashboard.experiments.scheduling.slurm.jobs import srun_command
from tests.conftest import need
from tests.slurm_cluster import SlurmCluster, slurm_cluster_running, slurm_missing
from tests.stack import Stack, stack_running, wait_for
from tests.test_integration import socket_open
from tests.test_script_stack import PLAIN_DDP, folder_packed, series_of
from tests.test_survival_integration import assert_history_whole, points

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
# What squeue says of a job waiting for nodes another holds (backfill's word, or the main
# scheduler's for a job behind one of higher priority).
SLURM_WAITS = ("Resources", "Priority")


@dataclass
class SlurmStack:
    cluster: SlurmCluster
    stack: Stack
    alice: requests.Session
    staff: requests.Session  # sets a queued run's priority

    def launch(self, **fields: Any) -> dict[str, Any]:
        body = {"strategy": "ddp", "processes": 1, "epochs": 1, "backend": "slurm", **fields}
        response = self.alice.post(f"{self.stack.base_url}/api/experiments/", json=body, timeout=30)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def run(self, pk: int, *, by: requests.Session | None = None) -> dict[str, Any]:
        """The run's read JSON, as alice (or `by`) reads it."""
        response = (by or self.alice).get(f"{self.stack.base_url}/api/experiments/{pk}/",
                                          timeout=10)  # fmt: skip
        return dict(response.json())

    def until(
        self, pk: int, test: Any, *, timeout: float, what: str, by: requests.Session | None = None
    ) -> dict[str, Any]:
        """The run once `test(run)` holds (its read JSON), with the logs where it never does."""
        try:
            found = wait_for(lambda: r if test(r := self.run(pk, by=by)) else None,
                             timeout=timeout, what=what, interval=0.3)  # fmt: skip
            return found or {}
        except TimeoutError:
            raise AssertionError(f"{what}: {self.run(pk, by=by)}\n{self.diagnostics()}") from None

    def diagnostics(self) -> str:
        jobs = "\n".join(
            f"--- {path}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted((self.stack.logs.parent / "runs").glob("*/slurm-*.out"))
        )
        return f"{self.cluster.jobs()}\n{jobs}\n{self.stack.diagnostics()}"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[SlurmStack]:
    missing = slurm_missing()
    need(not missing, f"Slurm is not installed here (no {', '.join(missing)})")
    # slurmd starts a job's processes as its user, and the cluster's conf says root's.
    need(os.geteuid() == 0, "the test cluster's slurmd and munged run as root: run as root")
    home = tmp_path_factory.mktemp("slurm")
    with slurm_cluster_running(home=home / "cluster") as cluster:
        env = {
            **cluster.env,
            "TRAINYARD_SLURM": "1",
            # The reconciler's round, and sbatch's warning, short for a test's patience.
            "TRAINYARD_SLURM_RECONCILE_SECONDS": "1",
            "TRAINYARD_SLURM_SIGNAL_SECONDS": "30",
        }
        with stack_running(home=home / "stack", data_dir=data_dir, env_extra=env) as stack:
            stack.user_create("alice")
            stack.user_create("sam", staff=True)
            yield SlurmStack(cluster=cluster, stack=stack, alice=stack.login("alice"),
                             staff=stack.login("sam"))  # fmt: skip


def test_a_run_larger_than_every_partition_is_refused(slurm: SlurmStack) -> None:
    url = f"{slurm.stack.base_url}/api/experiments/"
    body: dict[str, Any] = {"strategy": "ddp", "processes": 1, "backend": "slurm"}
    refused = slurm.alice.post(url, json={**body, "nodes": 3}, timeout=30)
    assert refused.status_code == 400, refused.text
    assert refused.json()["errors"]["nodes"] == ["partition debug has 2 nodes; this run asks for 3"]
    cores = slurm.alice.post(url, json={**body, "processes": 2}, timeout=30)
    assert cores.status_code == 400 and "1 CPU at most" in cores.json()["errors"]["processes"][0]
    unknown = slurm.alice.post(url, json={**body, "partition": "gpu"}, timeout=30)
    assert unknown.json()["errors"]["partition"] == ["no partition 'gpu'; its partitions: debug"]
    assert slurm.cluster.jobs() == {}  # nothing was submitted
    # The form offers the backend and the cluster's partitions (sinfo), the default first.
    page = slurm.alice.get(f"{slurm.stack.base_url}/experiments/new/", timeout=30).text
    assert 'id="backend-fields"' in page and '<option value="slurm">Slurm</option>' in page
    assert '<option value="" selected>default (debug)</option>' in page, page
    assert "debug: 2 node(s) of 1 CPU(s), 60 min at most" in page


# Task 0 writes long event lines (each cut in 5 to 20 pieces) while task 1 writes short lines on
# both streams, from the same moment.
CUT_LINES = """
import json, os, sys, time
time.sleep(max(0, float(os.environ["AT"]) - time.time()))
if os.environ["SLURM_PROCID"] == "0":
    for i in range(6):
        pad = "".join(chr(97 + k % 26) for k in range(5000 if i % 2 else 20000))
        print(json.dumps({"v": 1, "type": "step", "step": i, "pad": pad}), flush=True)
        said = json.dumps({"step": i, "pad": "é" * 3000}, ensure_ascii=False)
        print(said, file=sys.stderr, flush=True)
else:
    for i in range(2000):
        print(f"rank 1 line {i}", flush=True)
        print(f"rank 1 log {i}", file=sys.stderr, flush=True)
"""


def test_a_long_line_srun_cut_around_the_other_nodes_lines_comes_whole(
    slurm: SlurmStack,
) -> None:
    """The training's step as the supervisor starts and reads it (srun_command, --label, then
    SlurmStepProcess): every line of each task whole and in order, however srun cut it."""
    srun = srun_command(nodes=2, cwd="/", command=[sys.executable, "-c", CUT_LINES], tail=[])
    env = {**os.environ, **slurm.cluster.env, "AT": str(time.time() + 3)}
    popen = training_popen(command=srun, env=env, cwd="/", errors="surrogateescape")
    process = SlurmStepProcess(popen, job_id="", nodes=[])
    lines: dict[str, list[str | None]] = {"stdout": [], "stderr": []}
    deadline = time.monotonic() + 120
    while len([got for got in lines.values() if got and got[-1] is None]) < 2:  # both closed
        assert time.monotonic() < deadline, {name: got[-3:] for name, got in lines.items()}
        source, text = process.line_next(1.0)
        if source:  # else none came, or a piece (held)
            lines[source].append(text)
    assert popen.wait(timeout=30) == 0, lines["stderr"][-5:]
    out = [line for line in lines["stdout"] if line and not line.startswith("rank 1")]
    err = [line for line in lines["stderr"] if line and not line.startswith("rank 1")]
    assert [json.loads(line)["step"] for line in out] == list(range(6)), out[:2]
    assert [json.loads(line)["pad"] for line in err] == ["é" * 3000] * 6, err[:2]
    ones = [f"rank 1 line {i}\n" for i in range(2000)]
    assert [line for line in lines["stdout"] if line and line.startswith("rank 1")] == ones
    assert sum(bool(line and line.startswith("rank 1 log")) for line in lines["stderr"]) == 2000


def test_ddp_over_both_nodes_pends_requeues_resumes_and_succeeds(slurm: SlurmStack) -> None:
    """A DDP run over n1 and n2: its job in squeue while it trains, its points live; a second
    run pends with Slurm's reason and is cancelled from outside; sbatch's warning ends attempt 1
    with a checkpoint and a requeue, `scontrol requeue` (as a preemption does) ends attempt 2,
    and each next attempt resumes from that checkpoint, to the run's success."""
    launched = time.monotonic()
    run = slurm.launch(name="over two nodes", nodes=2)
    pk, api = run["id"], f"{slurm.stack.base_url}/api/experiments/{run['id']}"
    assert run["backend"] == "slurm" and run["scheduler"]["state"] == "PENDING", run
    job = run["scheduler"]["job_id"]
    with socket_open(slurm.stack, slurm.alice, pk) as ws:
        first, job_lines = _first_step(ws, timeout=180)
    first_point = time.monotonic() - launched
    # The page's job line followed the job without a reload: running once the job started it.
    assert job_lines[-1] == f"{job} (running)", job_lines
    assert slurm.cluster.jobs()[job] == (f"ty-{pk}", "RUNNING", "None")
    detail = slurm.run(pk)
    assert detail["scheduler"] == {"job_id": job, "state": "RUNNING", "reason": ""}
    assert [node["worker"] for node in detail["placement"]] == ["n1", "n2"]
    page = slurm.alice.get(f"{slurm.stack.base_url}/experiments/{pk}/", timeout=30).text
    assert f'<dd id="info-scheduler">{job} (running)</dd>' in page
    # The device page shows the cluster: its partition, both nodes taken, the run's job.
    devices = slurm.alice.get(f"{slurm.stack.base_url}/devices/", timeout=30).text
    assert 'id="slurm-cluster"' in devices and "<td>debug (default)</td>" in devices
    assert devices.count("<td>allocated</td>") == 2, devices
    assert f'<td>{job}</td><td><a href="/experiments/{pk}/">#{pk} over two nodes</a>' in devices
    assert first["train_loss"] > 0

    # The cluster is full: a second run pends, with the reason squeue gives.
    waiting = slurm.launch(name="waits for nodes", nodes=1)
    pending = slurm.until(waiting["id"], lambda r: r["scheduler"]["reason"] in SLURM_WAITS,
                          timeout=30, what="the pending run's reason")  # fmt: skip
    reason = pending["scheduler"]["reason"]
    assert pending["status"] == "queued" and pending["scheduler"]["state"] == "PENDING"
    assert pending["waiting_reason"].endswith(f"is pending: {reason}"), pending
    # Its priority is its job's nice (0 at the default, as a bare sbatch's), and follows a change.
    pending_job = pending["scheduler"]["job_id"]

    def nice() -> str:
        return slurm.cluster.run("squeue", "-h", "-j", pending_job, "-o", "%y").strip()

    assert nice() == "0", nice()
    moved = slurm.staff.post(
        f"{slurm.stack.base_url}/api/queue/{waiting['id']}/priority/", json={"priority": -700},
        timeout=30,
    )  # fmt: skip
    assert moved.status_code == 200, moved.text
    wait_for(lambda: nice() == "700", timeout=10, what="the job's nice after the priority")
    # An administrator cancels it: the run ends with the reason, within the reconciler's period.
    slurm.cluster.run("scancel", pending["scheduler"]["job_id"])
    cancelled = slurm.until(waiting["id"], lambda r: r["status"] == "cancelled", timeout=30,
                            what="the run of the job cancelled outside")  # fmt: skip
    assert "ended outside Trainyard: CANCELLED" in cancelled["error"], cancelled

    # sbatch's warning before the time limit (a site's before a preemption), as Slurm sends it:
    # to the batch shell only. The supervisor asks every rank for a checkpoint, ends the attempt
    # and requeues its job, whose next start resumes from that checkpoint.
    warned = time.monotonic()
    slurm.cluster.run("scancel", "--batch", "--signal=USR1", job)
    second = slurm.until(pk, lambda r: r["attempt"] == 2 and r["status"] == "running",
                         timeout=150, what="attempt 2, after the warning")  # fmt: skip
    warned_to_second = time.monotonic() - warned
    assert second["scheduler"]["job_id"] == job  # the same job, started again
    saved = slurm.alice.get(f"{api}/checkpoints/", timeout=10).json()["checkpoints"]
    step = max(c["step"] for c in saved)
    assert 0 < step < 32  # mid-epoch: written on the warning
    # An administrator's `scontrol requeue` (as a preemption without warning): the attempt
    # ends at once, and the job's next start resumes from the newest checkpoint.
    slurm.until(pk, lambda r: r["attempt"] == 2 and r["step"] > step, timeout=120,
                what="attempt 2's first step")  # fmt: skip
    requeued = time.monotonic()
    slurm.cluster.run("scontrol", "requeue", job)
    slurm.until(pk, lambda r: r["attempt"] == 3 and r["status"] == "running", timeout=150,
                what="attempt 3 in the requeued job")  # fmt: skip
    requeued_to_third = time.monotonic() - requeued
    final = slurm.until(pk, lambda r: r["status"] not in ("queued", "running"), timeout=180,
                        what="the resumed run's end")  # fmt: skip
    assert final["status"] == "succeeded", slurm.diagnostics()
    outcomes = [(a["outcome"], a["reason"]) for a in final["attempts"]]
    assert [outcome for outcome, _ in outcomes] == ["cancelled", "lost", "succeeded"], outcomes
    assert "Slurm's warning" in outcomes[0][1] and "requeued" in outcomes[1][1], outcomes
    assert_history_whole(points(slurm.stack, pk), epochs=1)
    resumed = slurm.stack.query(
        "SELECT message FROM experiments_logline WHERE experiment_id = ? AND message LIKE ?"
        " ORDER BY seq", pk, "Resumed from %",
    )  # fmt: skip
    assert len(resumed) == 2 and all(f", step {step} (" in said for (said,) in resumed), resumed
    assert final["test_accuracy"] > 0.5
    # Both nodes' machines sampled: the first by the supervisor, the second by its sampler.
    sampled = dict(slurm.stack.query(
        "SELECT key, COUNT(*) FROM experiments_seriespoint WHERE experiment_id = ? AND key LIKE ?"
        " GROUP BY key", pk, "machine/%/cpu_percent",
    ))  # fmt: skip
    assert set(sampled) == {"machine/n1/cpu_percent", "machine/n2/cpu_percent"}, sampled
    slurm.until(pk, lambda r: r["scheduler"]["state"] == "COMPLETED", timeout=30,
                what="the job's end mirrored")  # fmt: skip
    print(f"launch to first point over 2 Slurm nodes: {first_point:.1f} s; warning to attempt 2 "
          f"running: {warned_to_second:.1f} s; scontrol requeue to attempt 3 running: "
          f"{requeued_to_third:.1f} s")  # fmt: skip


def test_stop_cancels_the_job_and_leaves_no_process(slurm: SlurmStack) -> None:
    run = slurm.launch(name="to stop", nodes=2, epochs=5)
    pk = run["id"]
    slurm.until(pk, lambda r: r["step"] > 0, timeout=180, what="the first step")
    assert slurm.cluster.left_behind(), "the job's processes, while it trains"
    asked = time.monotonic()
    response = slurm.alice.post(f"{slurm.stack.base_url}/api/experiments/{pk}/stop/", timeout=10)
    assert response.status_code == 202
    final = slurm.until(pk, lambda r: r["status"] == "cancelled", timeout=60, what="the Stop")
    assert final["cancelled_by"] == "alice" and "alice" in final["error"]
    job = run["scheduler"]["job_id"]
    wait_for(lambda: slurm.cluster.jobs()[job][1] in ("COMPLETED", "CANCELLED"), timeout=30,
             what="the job's end")  # fmt: skip
    try:
        wait_for(lambda: not slurm.cluster.left_behind(), timeout=30, what="no job's process")
    except TimeoutError:
        left = [" ".join(p.cmdline())[:200] for p in slurm.cluster.left_behind()]
        raise AssertionError(f"left behind: {left}") from None
    print(f"Stop to no process left: {time.monotonic() - asked:.1f} s")


def test_a_users_script_runs_as_a_job_over_both_nodes_and_is_profiled(slurm: SlurmStack) -> None:
    """A script run (an uploaded folder and its entry point) on Slurm: one process a node, its
    ranks' figures and logs each reported, a profile on request, to its success."""
    base = slurm.stack.base_url
    packed = folder_packed(PLAIN_DDP)
    code = slurm.staff.post(f"{base}/api/code/", files={"archive": ("code.tar.gz", packed)},
                            timeout=30)  # fmt: skip
    assert code.status_code == 201, code.text
    launched = slurm.staff.post(f"{base}/api/experiments/", timeout=30, json={
        "name": "script on two nodes", "strategy": "script", "processes": 1, "nodes": 2,
        "backend": "slurm", "code": code.json()["id"], "entrypoint": "train.py",
        "args": ["--steps", "100", "--sleep", "0.05"],
    })  # fmt: skip
    assert launched.status_code == 201, launched.text
    pk = launched.json()["id"]
    api = f"{base}/api/experiments/{pk}"
    slurm.until(pk, lambda r: r["step"] > 0, timeout=120, what="the script's first step",
                by=slurm.staff)  # fmt: skip
    # A profile on request, as on a worker: the supervisor signals the process the training
    # named, on its node, through Slurm (step.py); every rank records, over both nodes.
    asked = slurm.staff.post(f"{api}/profile/", json={"steps": 3}, timeout=10)
    assert asked.status_code == 202, asked.text
    latest = f"{api}/profiles/latest/"
    profile = wait_for(
        lambda: None if (p := slurm.staff.get(latest, timeout=10).json()["profile"])["in_flight"]
        else p, timeout=60, what="the profile",
    )  # fmt: skip
    assert (profile["state"], profile["recorded_steps"]) == ("ready", 3), profile
    traces = slurm.staff.get(f"{api}/profiles/", timeout=10).json()
    assert sorted(t["rank"] for t in traces) == [0, 1] and all(t["bytes"] for t in traces)
    final = slurm.until(pk, lambda r: r["status"] not in ("queued", "running"), timeout=180,
                        what="the script run's end", by=slurm.staff)  # fmt: skip
    assert final["status"] == "succeeded", f"{final}\n{slurm.diagnostics()}"
    assert [node["worker"] for node in final["placement"]] == ["n1", "n2"]
    assert {"rank/0/loss", "rank/1/loss"} <= series_of(slurm.staff, slurm.stack, pk).keys()
    logs = slurm.staff.get(f"{base}/api/experiments/{pk}/logs/", timeout=10).json()
    assert logs["ranks"] == [0, 1], logs


def _first_step(ws: Any, *, timeout: float) -> tuple[dict[str, Any], list[str]]:
    """The first step message, and the job lines the page was given until then (the
    snapshot's, then each scheduler message's)."""
    deadline, lines = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        message = json.loads(ws.recv(timeout=deadline - time.monotonic()))
        assert message["type"] not in ("finished", "failed"), message
        if message["type"] == "snapshot":
            lines.append(message["texts"]["scheduler"])
        if message["type"] == "scheduler":
            lines.append(message["text"])
        if message["type"] == "step":
            return dict(message), lines
    raise TimeoutError("no step message")
