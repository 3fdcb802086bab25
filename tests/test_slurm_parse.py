"""The Slurm backend's reading of the commands' output, and what it asks of sbatch: no cluster.

The 22.05 output was recorded from Debian 12's slurm-wlm 22.05.8 on this machine's two-node
cluster (tests/slurm_cluster.py); the newer one is in 24.05's forms (typed GPUs with their sockets,
CPUEfctv, ResumeAfterTime, a drained node's reason with spaces, several kinds of node in one
partition), as its man pages give them.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dashboard.experiments.scheduling.slurm import jobs
from dashboard.experiments.scheduling.slurm.commands import SlurmError
from dashboard.experiments.scheduling.slurm.jobs import (
    JobRequest,
    batch_script,
    job_name,
    sbatch_args,
    slurm_job_submit,
    slurm_jobs,
    slurm_partitions,
    warning_seconds,
)
from dashboard.experiments.scheduling.slurm.launch import partition_refusals
from dashboard.experiments.scheduling.slurm.parse import (
    SQUEUE_FORMAT,
    Partition,
    SlurmJob,
    SlurmNode,
    gres_gpus,
    scontrol_nodes_parse,
    scontrol_pairs,
    sinfo_parse,
    squeue_parse,
    time_minutes,
)
from dashboard.experiments.scheduling.slurm.texts import pending_text
from tests.slurm_fake import SlurmFake, slurm_fake_install

SQUEUE_22_05 = "2|ty-7|PENDING|Priority\n1|ty-6|RUNNING|None\n3|wrap|COMPLETED|None\n"
SINFO_22_05 = "debug|up|1:00:00|2|1|(null)|debug*\n"
SCONTROL_NODE_22_05 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=3.87 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=vm Port=58069 Version=22.05.8 OS=Linux 6.18.44-fc-v1300 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=15356 Sockets=1 Boards=1 State=IDLE "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-06T09:05:04 SlurmdStartTime=2026-12-06T16:05:57 "
    "LastBusyTime=2026-12-06T16:05:57 CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=3.87 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=vm Port=52627 Version=22.05.8 OS=Linux 6.18.44-fc-v1300 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1 AllocMem=0 FreeMem=15356 Sockets=1 Boards=1 State=IDLE "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug  "
    "BootTime=2026-12-06T09:05:04 SlurmdStartTime=2026-12-06T16:05:57 "
    "LastBusyTime=2026-12-06T16:05:57 CfgTRES=cpu=1,mem=1M,billing=1 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n"
)

SQUEUE_24_05 = (
    "4811|ty-12|PENDING|QOSMaxJobsPerUserLimit\n"
    "4812|ty-13|PENDING|ReqNodeNotAvail, UnavailableNodes:gpu[003-004]\n"
    "4790_3|ty-9|RUNNING|None\n"
    "4700|ty-a|b|CANCELLED|None\n"
    "4701|train.sh|RUNNING|None\n"
)
SINFO_24_05 = (
    "gpu|up|2-00:00:00|2|64|gpu:a100:4(S:0-1)|gpu\n"
    "gpu|up|2-00:00:00|2|48|gpu:a100:2(S:0),gpu:v100:2(S:1)|gpu\n"
    "cpu|up|infinite|10|128|(null)|cpu*\n"
    "debug|down|30:00|1|8+|(null)|debug\n"
)
SCONTROL_NODE_24_05 = (
    "NodeName=gpu001 Arch=x86_64 CoresPerSocket=32 CPUAlloc=16 CPUEfctv=64 CPUTot=64 "
    "CPULoad=12.34 AvailableFeatures=a100 ActiveFeatures=a100 Gres=gpu:a100:4(S:0-1) "
    "NodeAddr=10.1.0.11 NodeHostName=gpu001 Version=24.05.2 OS=Linux 5.14.0-427.el9.x86_64 #1 "
    "SMP PREEMPT_DYNAMIC Wed May 1 19:11:28 UTC 2024 RealMemory=515000 AllocMem=128000 "
    "FreeMem=401234 Sockets=2 Boards=1 State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 "
    "Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2024-06-01T08:00:00 "
    "SlurmdStartTime=2024-06-01T08:01:00 LastBusyTime=2024-06-03T10:00:00 "
    "ResumeAfterTime=None CfgTRES=cpu=64,mem=515000M,billing=64,gres/gpu=4 "
    "AllocTRES=cpu=16,mem=128000M,gres/gpu=2 CurrentWatts=0 AveWatts=0\n"
    "NodeName=gpu002 Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 "
    "CPULoad=0.01 AvailableFeatures=a100 ActiveFeatures=a100 Gres=gpu:a100:4(S:0-1) "
    "NodeAddr=10.1.0.12 NodeHostName=gpu002 Version=24.05.2 OS=Linux 5.14.0-427.el9.x86_64 #1 "
    "SMP PREEMPT_DYNAMIC Wed May 1 19:11:28 UTC 2024 RealMemory=515000 AllocMem=0 "
    "FreeMem=510000 Sockets=2 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 "
    "Owner=N/A MCS_label=N/A Partitions=gpu BootTime=2024-06-01T08:00:00 "
    "SlurmdStartTime=2024-06-01T08:01:00 LastBusyTime=2024-06-03T09:00:00 "
    "ResumeAfterTime=None CfgTRES=cpu=64,mem=515000M,billing=64,gres/gpu=4 AllocTRES= "
    "CurrentWatts=0 AveWatts=0 Reason=bad dimm in slot 3 [root@2024-06-02T09:00:00]\n"
)


def test_squeue_22_05() -> None:
    assert squeue_parse(SQUEUE_22_05) == [
        SlurmJob("2", "ty-7", "PENDING", "Priority"),
        SlurmJob("1", "ty-6", "RUNNING", ""),
        SlurmJob("3", "wrap", "COMPLETED", ""),
    ]
    pending, running, ended = squeue_parse(SQUEUE_22_05)
    assert pending.pending and not pending.ended
    assert not running.pending and not running.ended
    assert ended.ended


def test_squeue_24_05_reasons_array_ids_and_a_name_with_a_bar() -> None:
    jobs = squeue_parse(SQUEUE_24_05)
    assert [(j.job_id, j.name, j.state) for j in jobs] == [
        ("4811", "ty-12", "PENDING"),
        ("4812", "ty-13", "PENDING"),
        ("4790_3", "ty-9", "RUNNING"),
        ("4700", "ty-a|b", "CANCELLED"),
        ("4701", "train.sh", "RUNNING"),
    ]
    assert jobs[0].reason == "QOSMaxJobsPerUserLimit"
    assert jobs[1].reason == "ReqNodeNotAvail, UnavailableNodes:gpu[003-004]"
    assert pending_text(job_id="4811", state="PENDING", reason=jobs[0].reason) == (
        "waiting in Slurm: job 4811 is pending: QOSMaxJobsPerUserLimit"
    )


def test_sinfo_22_05() -> None:
    assert sinfo_parse(SINFO_22_05) == [
        Partition("debug", up=True, nodes=2, cpus_per_node=1, gpus_per_node=0, max_minutes=60,
                  default=True),
    ]  # fmt: skip


def test_sinfo_24_05_adds_up_kinds_of_node() -> None:
    gpu, cpu, debug = sinfo_parse(SINFO_24_05)
    assert gpu == Partition("gpu", up=True, nodes=4, cpus_per_node=64, gpus_per_node=4,
                            max_minutes=2880)  # fmt: skip
    assert cpu == Partition("cpu", up=True, nodes=10, cpus_per_node=128, gpus_per_node=0,
                            max_minutes=None, default=True)  # fmt: skip
    assert debug == Partition("debug", up=False, nodes=1, cpus_per_node=8, gpus_per_node=0,
                              max_minutes=30)  # fmt: skip
    assert gpu.describe() == "gpu: 4 node(s) of 64 CPU(s), 4 GPU(s), 2880 min at most"


def test_scontrol_nodes_22_05() -> None:
    assert scontrol_nodes_parse(SCONTROL_NODE_22_05) == [
        SlurmNode("n1", "127.0.0.1", cpus=1, gpus=0, state="IDLE", hostname="vm"),
        SlurmNode("n2", "127.0.0.1", cpus=1, gpus=0, state="IDLE", hostname="vm"),
    ]
    pairs = scontrol_pairs(SCONTROL_NODE_22_05.splitlines()[0])
    assert pairs["OS"] == "Linux 6.18.44-fc-v1300 #1 SMP PREEMPT_DYNAMIC @0"
    assert pairs["AllocTRES"] == ""


def test_scontrol_nodes_24_05() -> None:
    first, drained = scontrol_nodes_parse(SCONTROL_NODE_24_05)
    assert first == SlurmNode("gpu001", "10.1.0.11", cpus=64, gpus=4, state="MIXED",
                              hostname="gpu001")  # fmt: skip
    assert drained.state == "IDLE+DRAIN" and drained.address == "10.1.0.12"
    reason = scontrol_pairs(SCONTROL_NODE_24_05.splitlines()[1])["Reason"]
    assert reason == "bad dimm in slot 3 [root@2024-06-02T09:00:00]"


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("infinite", None), ("UNLIMITED", None), ("45", 45), ("30:00", 30), ("0:30", 1),
     ("2:00:00", 120), ("1-12", 2160), ("1-2:30", 1590), ("7-00:00:00", 10080)],
)  # fmt: skip
def test_time_limits_in_minutes(text: str, minutes: int | None) -> None:
    assert time_minutes(text) == minutes


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [("(null)", 0), ("", 0), ("gpu:4", 4), ("gpu:a100:4(S:0-1)", 4),
     ("gpu:a100:2(S:0),gpu:v100:2(S:1)", 4), ("gpu:a100:4(S:0-1),shard:8", 4), ("mps:100", 0)],
)  # fmt: skip
def test_gpus_of_a_gres(gres: str, gpus: int) -> None:
    assert gres_gpus(gres) == gpus


def test_what_no_partition_could_run_is_said_on_its_field() -> None:
    (debug,) = sinfo_parse(SINFO_22_05)
    fits = {"nodes": 2, "ranks_per_node": 1, "gpus_per_node": 0, "time_limit_minutes": 60}
    assert partition_refusals(debug, **fits) == {}
    too_big = partition_refusals(debug, **{**fits, "nodes": 3, "time_limit_minutes": 61})
    assert too_big == {
        "nodes": ["partition debug has 2 nodes; this run asks for 3"],
        "time_limit_minutes": ["partition debug runs a job 60 minutes at most; this run asks "
                               "for 61"],
    }  # fmt: skip
    gpus = partition_refusals(debug, **{**fits, "gpus_per_node": 2})
    assert gpus == {"gpus": ["partition debug's nodes have 0 GPUs at most; this run asks for 2 "
                             "on each"]}  # fmt: skip


def test_sbatch_is_asked_for_one_task_a_node_a_requeue_and_the_warning(settings) -> None:
    settings.TRAINYARD_SLURM_PARTITION = "cpu"
    settings.TRAINYARD_SLURM_SBATCH_ARGS = "--qos=normal --account 'ml team'"
    settings.TRAINYARD_SLURM_SIGNAL_SECONDS = 90
    request = JobRequest(
        experiment_id=12, nodes=2, ranks_per_node=4, gpus_per_node=2, partition="",
        time_limit_minutes=30, log=settings.BASE_DIR / "x.out",
    )  # fmt: skip
    args = sbatch_args(request)
    assert args[:2] == ["sbatch", "--parsable"]
    for flag in ("--job-name=ty-12", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4",
                 "--requeue", "--signal=B:USR1@90", "--partition=cpu", "--time=30",
                 "--gres=gpu:2"):  # fmt: skip
        assert flag in args, (flag, args)
    assert args[-3:] == ["--qos=normal", "--account", "ml team"]
    assert job_name(12) == "ty-12"


def test_the_job_script_execs_the_supervisor() -> None:
    """The batch shell becomes the supervisor, so that sbatch's B: signals reach it."""
    script = batch_script(experiment_id=7)
    done = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    last = script.splitlines()[-1]
    assert last.startswith("exec ") and last.endswith("manage.py slurm_job 7")


def test_a_request_goes_to_the_node_of_the_process_it_names() -> None:
    from dashboard.experiments.runs.slurm.step import process_node

    nodes = [SlurmNode("gpu001", "10.1.0.11", 64, 4, "MIXED", "gpu001.cluster"),
             SlurmNode("gpu002", "10.1.0.12", 64, 4, "MIXED", "gpu002.cluster")]  # fmt: skip
    started = {"pids": [900, 901, 17, 18],
               "machines": ["gpu002.cluster", "gpu002.cluster", "gpu001.cluster",
                            "gpu001.cluster"]}  # fmt: skip
    assert process_node(started=started, pid=900, nodes=nodes) == "gpu002"  # rank 0's
    assert process_node(started=started, pid=17, nodes=nodes) == "gpu001"
    # A script's launcher names itself, not a rank: it is on rank 0's node.
    assert process_node(started=started, pid=4242, nodes=nodes) == "gpu002"
    assert process_node(started=None, pid=900, nodes=nodes) == "gpu001"  # nothing said yet


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmFake:
    return slurm_fake_install(tmp_path, monkeypatch)


def test_a_heterogeneous_job_is_one_job_of_the_id_sbatch_gave() -> None:
    """squeue lists a het job a component a line; its id is sbatch's `123`, said once: read as
    `123+0` and `123+1`, the run's job `123` was gone from the queue (lost, submitted again)
    and both components were strays to cancel."""
    out = "123+0|ty-5|RUNNING|None\n123+1|ty-5|RUNNING|None\n124_2|ty-6|PENDING|Priority\n"
    assert squeue_parse(out) == [
        SlurmJob("123", "ty-5", "RUNNING", ""),
        SlurmJob("124_2", "ty-6", "PENDING", "Priority"),
    ]


def test_only_this_accounts_jobs_are_read(fake: SlurmFake) -> None:
    """Another user's job named ty-5 is not run 5's: the reconciler would cancel it as a stray."""
    fake.command("squeue", out="7|ty-5|RUNNING|None\n8|train|RUNNING|None\n")
    assert list(slurm_jobs()) == ["7"]
    assert fake.calls("squeue") == [f"squeue --me -h -t all -o {SQUEUE_FORMAT}"]


def test_sbatch_answering_no_job_id_is_a_refusal(fake: SlurmFake, settings: Any) -> None:
    """A job id goes on the run and into scancel's and srun's arguments: only digits."""
    settings.TRAINYARD_SLURM_SSH = ""
    request = JobRequest(experiment_id=3, nodes=1, ranks_per_node=1, gpus_per_node=0,
                         partition="", time_limit_minutes=None,
                         log=fake.bin.parent / "runs" / "slurm-%j.out")  # fmt: skip
    fake.command("sbatch", out="41;cluster-a\n")
    assert slurm_job_submit(request) == "41"
    fake.command("sbatch", out="Submitted batch job 42\n")
    with pytest.raises(SlurmError, match="sbatch answered no job id"):
        slurm_job_submit(request)


def test_the_pages_ask_the_cluster_once_a_few_seconds(
    fake: SlurmFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launch form and its checks, the device page: sinfo once, not once a page load."""
    fake.command("sinfo", out=SINFO_22_05)
    assert slurm_partitions() == slurm_partitions() == sinfo_parse(SINFO_22_05)
    assert len(fake.calls("sinfo")) == 1
    monkeypatch.setattr(jobs, "FACTS_SECONDS", 0.0)
    slurm_partitions()
    assert len(fake.calls("sinfo")) == 2
    fake.command("sinfo", out="", status=1)  # a failure is said, never kept
    with pytest.raises(SlurmError):
        slurm_partitions()


def test_the_warning_comes_within_a_short_time_limit(settings: Any) -> None:
    """sbatch's warning as long as the run's limit came at its job's start, every start: a
    checkpoint and a requeue forever, and the supervisor not yet listening."""
    settings.TRAINYARD_SLURM_SIGNAL_SECONDS = 120
    assert warning_seconds(time_limit_minutes=None) == 120
    assert warning_seconds(time_limit_minutes=60) == 120
    assert warning_seconds(time_limit_minutes=2) == 60
    assert warning_seconds(time_limit_minutes=1) == 30
    request = JobRequest(experiment_id=1, nodes=1, ranks_per_node=1, gpus_per_node=0,
                         partition="", time_limit_minutes=1, log=Path("x.out"))  # fmt: skip
    assert "--signal=B:USR1@30" in sbatch_args(request)


def test_the_job_script_outlives_a_warning_before_the_supervisor_listens() -> None:
    """sbatch's SIGUSR1 to the batch shell while Python and Django start (SIGUSR1's default is
    to end the process): ignored until the supervisor takes it, across exec."""
    script = batch_script(experiment_id=7).rsplit("exec ", 1)[0]
    check = ("import os, signal; os.kill(os.getpid(), signal.SIGUSR1); "
             "print('alive after SIGUSR1')")  # fmt: skip
    script += f"kill -USR1 $$\nexec {sys.executable} -c {shlex.quote(check)}\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False,
                          timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "alive after SIGUSR1\n"), done.stderr
