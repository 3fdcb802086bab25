"""Where a script's steps go, with no Trainyard line in it (issue 33): the observer every rank
runs before the script (training/scripts/observer.py), through the launcher as the worker
starts it, no dashboard (tests/test_script_stack.py has the run page's side).

tests/scripts/observed/train.py trains a small CNN on Fashion-MNIST through a DataLoader, wrapped
in DDP or sharded by FSDP2, or alone; it imports neither trainyard nor training.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from dashboard.experiments.metrics.breakdown import experiment_straggler
from dashboard.experiments.metrics.stragglers import straggler_context, straggler_text
from dashboard.experiments.runs.sink import EventSink
from tests.test_protocol import EVENT_CLASSES, assert_matches, assert_nested_match
from tests.test_script_runs import ROOT, Launched
from tests.test_stragglers import Pauser
from training.observe.phases import PHASES
from training.protocol import MemoryEntry, StalledRank

OBSERVED = ROOT / "tests" / "scripts" / "observed"
STALLED_TEXT = re.compile(
    r"No step for \d+ s: rank 1 never entered (all_reduce #\d+); "
    r"rank 0 waits in it since \d\d:\d\d:\d\d UTC\."
)
# The script's model: 160 + 4,640 + 8,010 float32 parameters.
MODEL_BYTES = 4 * (16 * 9 + 16 + 32 * 16 * 9 + 32 + 32 * 5 * 5 * 10 + 10)
BATCH = 32
# The paused rank's pauses, longer than test_stragglers.py's: this script's step is a few ms
# of compute, and on a busy machine (CI's two workers) the other rank's is stretched as much by
# the cores it waits for, so a rank paused 60% of the time read as little as 0.3 slower, under
# the rule's 0.5 (CI named nobody). Paused 85% it is slower several times over.
PAUSE_PERIOD, PAUSED = 0.05, 0.85


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    shutil.copytree(OBSERVED, folder)
    shutil.copy(ROOT / "tests" / "scripts" / "fashion.py", folder)
    return folder


def windows(
    tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch, *, nproc: int, wrap: str
) -> list[dict[str, Any]]:
    """The run's step events (the observer's windows, every 4 steps)."""
    monkeypatch.setenv("TRAINYARD_OBSERVE_EVERY", "4")
    run = Launched(tmp_path, "--nproc", str(nproc), "--entrypoint", "train.py", code=code,
                   args=["--wrap", wrap, "--epochs", "2", "--images", "1024"])  # fmt: skip
    assert run.end() == 0, run.stderr
    steps = run.of_type("step")
    assert steps, run.stderr
    return steps


def assert_whole(step: dict[str, Any], steps_in: int, ranks: int) -> None:
    """Each rank's six phases add up to its window's wall time (its samples over its images/s),
    and the run's images/s are its ranks'."""
    assert [r["rank"] for r in step["ranks"]] == list(range(ranks))
    for rank in step["ranks"]:
        wall = steps_in * BATCH / rank["images_per_second"]
        phases = sum(rank[f"{name}_seconds"] for name in PHASES)
        assert phases == pytest.approx(wall, rel=0.05), rank
        assert rank["compute_seconds"] == pytest.approx(
            sum(rank[f"{name}_seconds"] for name in PHASES if name not in ("data", "other"))
        )
        assert min(rank[f"{name}_seconds"] for name in PHASES) >= 0
        assert rank["forward_seconds"] > 0 and rank["backward_seconds"] > 0 and rank["data_seconds"]
    total = sum(r["images_per_second"] for r in step["ranks"])
    assert step["images_per_second"] == pytest.approx(total, abs=0.2)
    assert step["epoch"] == 0 and "train_loss" not in step
    # The launcher's step events are the protocol's (1.12), nested entries too.
    assert_matches(step, EVENT_CLASSES["step"], every=False)
    assert_nested_match(step, every=True)
    for entry in step["memory"]:
        assert_matches(entry, MemoryEntry, every=True)


@pytest.mark.parametrize(
    ("wrap", "per_step"),
    [
        # DDP all-reduces every gradient: 2(N-1)/N x the model's bytes, N = 2.
        ("ddp", MODEL_BYTES),
        # FSDP2 all-gathers each shard for forward and again for backward ((N-1) x a half each)
        # and reduce-scatters the gradients ((N-1)/N x all of them).
        ("fsdp", MODEL_BYTES // 2 * 3),
    ],
)
@pytest.mark.django_db
def test_a_scripts_phases_and_bytes_are_measured_on_every_rank(
    tmp_path: Path,
    code: Path,
    monkeypatch: pytest.MonkeyPatch,
    wrap: str,
    per_step: int,
    experiment_factory: Any,
    user_factory: Any,
) -> None:
    steps = windows(tmp_path, code, monkeypatch, nproc=2, wrap=wrap)
    even = experiment_factory(owner=user_factory(), strategy="script")
    sink = EventSink(even)
    for step in steps:
        sink.add(step)
    sink.flush()
    assert experiment_straggler(experiment=even) is None  # even ranks: nobody named
    # 1,024 images over 2 ranks in batches of 32: 16 steps an epoch, 2 epochs; a window the
    # first step, then every 4.
    assert [s["step"] for s in steps] == [1, 5, 9, 13, 17, 21, 25, 29]
    previous = 0
    for step in steps:
        steps_in = step["step"] - previous
        previous = step["step"]
        assert_whole(step, steps_in, ranks=2)
        for rank in step["ranks"]:
            assert rank["communication_bytes"] == per_step * steps_in, (wrap, rank)
            assert rank["communication_seconds"] > 0
            # Every collective entered, at least one a step (protocol 1.14), ...
            assert rank["collectives"] >= steps_in, rank
        # ... and each rank's arrival at them against the other's: one's lateness the other's
        # lead.
        late = [rank["arrived_late_seconds"] for rank in step["ranks"]]
        assert late[0] == -late[1] and abs(late[0]) < 1, late
        # What each rank holds: DDP a whole copy, FSDP2 its half (SGD without momentum keeps
        # no state); the gradients of the last step, as many.
        held = MODEL_BYTES if wrap == "ddp" else MODEL_BYTES // 2
        assert [(m["rank"], m["parameter_bytes"], m["gradient_bytes"], m["optimizer_state_bytes"])
                for m in step["memory"]] == [(0, held, held, 0), (1, held, held, 0)]  # fmt: skip
        assert min(m["peak_bytes"] for m in step["memory"]) > 0


@pytest.mark.django_db
def test_a_paused_rank_of_a_script_is_named_by_when_it_comes_to_the_collectives_and_its_phase(
    tmp_path: Path,
    code: Path,
    monkeypatch: pytest.MonkeyPatch,
    experiment_factory: Any,
    user_factory: Any,
) -> None:
    """Rank 1 of a plain DDP script, paused (SIGSTOP) most of every tenth of a second as
    tests/test_stragglers.py pauses an engine's rank: its windows stored as the supervisor
    stores them, it is named with how late it comes and the phase of its extra time; the even
    runs of test_a_scripts_phases_and_bytes_are_measured_on_every_rank name nobody. 192 steps,
    a window every 4: the rule's latest 20 windows all come after the pauses began (the first
    window's event starts them), some 3 s of training at a paused rank's pace."""
    monkeypatch.setenv("TRAINYARD_OBSERVE_EVERY", "4")
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", code=code,
                   args=["--wrap", "ddp", "--epochs", "6", "--images", "2048"])  # fmt: skip
    run.wait_for(lambda e: e["type"] == "step")  # the ranks are in the script
    pauser = Pauser(rank_pid(run.process.pid, 1), period=PAUSE_PERIOD, stopped=PAUSED)
    pauser.start()
    try:
        assert run.end() == 0, run.stderr
    finally:
        pauser.stop()
    experiment = experiment_factory(owner=user_factory(), strategy="script")
    sink = EventSink(experiment)
    for step in run.of_type("step"):
        sink.add(step)
    sink.flush()
    named = experiment_straggler(experiment=experiment)
    assert named is not None and named["rank"] == 1, run.of_type("step")
    assert named["late_seconds"] is not None and named["late_seconds"] > 0.005, named
    text = straggler_text(named, context=straggler_context(experiment=experiment, straggler=named))
    said = (r"rank 1 is \d+\.\dx slower than the median since step \d+: it reaches each "
            r"collective \d+ ms after the others; the others spend \d+% of their time waiting "
            r"for it in communication; its \w+ takes (\d+\.\dx theirs|"
            r"\d+(\.\d)? m?s more than theirs)$")  # fmt: skip
    assert re.match(said, text), text


def rank_pid(launcher: int, rank: int) -> int:
    """The pid of a launcher's rank, by the RANK torchrun gave it."""
    for process in psutil.Process(launcher).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.environ().get("RANK") == str(rank) and "python" in process.name():
                return process.pid
    raise AssertionError(f"no rank {rank} under {launcher}")


def test_one_process_has_no_communication(
    tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = windows(tmp_path, code, monkeypatch, nproc=1, wrap="none")
    assert [s["step"] for s in steps][:3] == [1, 5, 9]
    for step in steps[1:]:
        assert_whole(step, 4, ranks=1)
        [rank] = step["ranks"]
        assert rank["communication_bytes"] == 0 and rank["communication_seconds"] == 0


BROKEN = textwrap.dedent(
    """
    import sys
    import torch
    from torch.nn.modules import module as modules
    from training.observe import phases
    from training.scripts.observer import observer_install

    observer = observer_install({"RANK": "0", "WORLD_SIZE": "1", "TRAINYARD_OBSERVE_EVERY": "3"})
    entered = phases.CLOCK.enter

    def enter(name):
        if name == "backward":
            raise RuntimeError("a clock that breaks")
        entered(name)

    phases.CLOCK.enter = enter
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        loss = model(torch.ones(2, 4)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("trained", step + 1, "steps")
    print("hooks left", len(modules._global_forward_pre_hooks) + len(modules._global_forward_hooks))
    print("backward wrapped", hasattr(torch.autograd.backward, "__wrapped__"))
    print("modules wrapped", hasattr(torch.nn.Module.__call__, "__wrapped__"))
    """
)


def test_an_observer_hook_that_raises_is_said_once_and_the_script_trains_on() -> None:
    done = subprocess.run([sys.executable, "-c", BROKEN], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "observer stopped" in line]
    assert said == [
        "trainyard's observer stopped: its backward hook raised RuntimeError: a clock "
        "that breaks; the script goes on, unobserved"
    ], done.stderr
    assert "trained 8 steps" in done.stdout
    # Taken out at the next window's end: nothing of it is left in the process.
    assert "hooks left 0" in done.stdout and "backward wrapped False" in done.stdout
    assert "modules wrapped False" in done.stdout


UNEVEN = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    own = [dist.new_group([i]) for i in range(dist.get_world_size())]
    # DDP over a group of one: each rank averages its own gradients only.
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(1, 1, bias=False), process_group=own[rank]
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10 if rank == 0 else 6):  # rank 0 steps on alone after step 6
        loss = model(torch.full((4, 1), float(rank + 1))).sum()
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            print(f"rank {rank} grad {model.module.weight.grad.item()}", flush=True)
        optimizer.step()
    print(f"rank {rank} done", flush=True)
    del model, optimizer
    dist.destroy_process_group()
    """
)


def test_ranks_that_step_unevenly_lose_the_observer_not_their_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks that never all reach a window's step (DDP's Join, a learner beside actors) are not
    held: the observer waits TRAINYARD_OBSERVE_WAIT_SECONDS for them, then leaves for good; and
    the default hook it gives DDP keeps DDP's own group (not every rank's)."""
    code = tmp_path / "uneven"
    code.mkdir()
    (code / "train.py").write_text(UNEVEN)
    monkeypatch.setenv("TRAINYARD_OBSERVE_EVERY", "4")
    monkeypatch.setenv("TRAINYARD_OBSERVE_WAIT_SECONDS", "3")
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", code=code, args=[])
    assert run.end() == 0, run.stderr
    for said in ("rank 0 grad 4.0", "rank 1 grad 8.0", "rank 0 done", "rank 1 done"):
        assert said in run.stderr, run.stderr
    assert "its ranks did not meet at step 9 within 3 s" in run.stderr
    assert [s["step"] for s in run.of_type("step")] == [1, 5]


def test_a_hung_rank_is_named_with_its_stack_until_it_steps_and_a_stop_ends_every_process(
    tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 sleeps before step 6's forward for 8 s, then before step 12's for good; rank 0
    waits for it in DDP's all-reduce. The watch's floor, 2 s here (60 s by default)."""
    monkeypatch.setenv("TRAINYARD_STALL_SECONDS", "2")
    run = Launched(tmp_path, "--nproc", "2", "--entrypoint", "train.py", code=code,
                   args=["--wrap", "ddp", "--epochs", "20", "--images", "1024",
                         "--pause", "6:8", "--pause", "12:3600"])  # fmt: skip
    first = run.wait_for(lambda e: e["type"] == "stalled")
    assert_stalled(first)
    over = run.wait_for(lambda e: e["type"] == "stalled")
    assert over["since"] is None and over["ranks"] == [], over
    assert over["text"].startswith("The stall is over after ") and "steps again" in over["text"]
    second = run.wait_for(lambda e: e["type"] == "stalled")
    assert_stalled(second)
    assert STALLED_TEXT.match(second["text"])[1] != STALLED_TEXT.match(first["text"])[1]
    ranks = psutil.Process(run.process.pid).children(recursive=True)
    run.process.send_signal(signal.SIGTERM)  # the dashboard's Stop
    assert run.end() == 143, run.stderr
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def assert_stalled(event: dict[str, Any]) -> None:
    assert_matches(event, EVENT_CLASSES["stalled"], every=False)
    for entry in event["ranks"]:
        assert_matches(entry, StalledRank, every=True)
    found = STALLED_TEXT.match(event["text"])
    assert found, event["text"]
    waiting, hung = event["ranks"]
    # Each rank's own last collective: rank 0 is in the latest, rank 1 done with the one before.
    assert [(r["rank"], r["entered"]) for r in (waiting, hung)] == [(0, True), (1, False)]
    latest = int(found[1].split("#")[1])
    # (an all-reduce of DDP's, or the observer's own window all-gather)
    assert waiting["collective"] == found[1] and hung["collective"].endswith(f" #{latest - 1}")
    assert waiting["line"].startswith(f"rank 0 waits in {found[1]} since ")
    before = hung["collective"]
    assert hung["line"] == f"rank 1 never entered {found[1]}: its last, {before}, done"
    assert event["since"] <= waiting["waiting_since"] + 1 and hung["waiting_since"] is None
    # Each rank's Python stack, taken from outside: where the script is.
    assert 'train.py", line' in waiting["stack"] and "backward" in waiting["stack"]
    assert "in wait_for_nothing" in hung["stack"], hung["stack"]
