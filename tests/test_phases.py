"""Where each rank's time goes (protocol 1.9, training/observe/phases.py): the phases of real
runs add up to their wall time, DDP's communication and bytes, the sink's series and the read JSON's
breakdown."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from django.core import mail
from django.test import Client
from torch import nn

from dashboard.experiments.metrics.breakdown import PHASES, experiment_straggler
from dashboard.experiments.metrics.stragglers import (
    StragglerContext,
    stage_imbalance_text,
    straggler_context,
    straggler_text,
)
from dashboard.experiments.models import LogLine, SeriesPoint
from dashboard.experiments.runs.sink import EventSink
from dashboard.experiments.runs.stragglers import events_flush
from dashboard.notifications.models import NotificationSettings
from tests.few_digits import sample_data_few  # noqa: F401 (the sample_data fixture)
from tests.phase_checks import SECONDS, assert_phases_add_up, phase_windows
from tests.test_training import Result, needs_cuda, run_cli
from tests.test_training_target import assert_trained_every_epoch
from training.models.build import model_stages, stages_split
from training.models.simple_cnn import SimpleCNN
from training.observe import collectives, phases
from training.observe.phases import CLOCK_PHASES, PhaseClock
from training.strategies.common import step_default
from training.strategies.pipeline import stage_modules

STEPS, INTERVAL = 12, 6


# ---- the clock ----------------------------------------------------------------------------


def test_nested_phases_charge_the_innermost_and_a_hand_over_ends_in_communication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a clock the test moves (no sleeps: timings on shared cores vary): a hook's own call
    is communication, and so is backward's wait after the last bucket was handed over."""
    now = [100.0]
    monkeypatch.setattr(phases, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def spend(seconds: float) -> None:
        now[0] += seconds

    clock = PhaseClock()
    with clock.phase("backward"):
        spend(0.02)
        with clock.phase("communication"):  # a hook's own call
            spend(0.02)
        clock.handed_over()
        spend(0.03)  # waiting for what was handed over
    spend(0.5)  # between phases: nobody's
    with clock.phase("optimizer"):
        spend(0.01)
    forward, backward, optimizer, communication, sent = clock.read()
    assert forward == 0 and sent == 0
    assert backward == pytest.approx(0.02)  # the wait after the hand-over is not backward's
    assert communication == pytest.approx(0.05)
    assert optimizer == pytest.approx(0.01)


def test_functional_collectives_count_by_their_group_once_and_never_fail_for_counting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """funcol's collectives as tensor parallel calls them, on a module the test makes (no
    process group: the groups are lists of ranks): the ring's bytes over the group's size, a
    deprecated alias that calls the timed collective counted once, and a group the counting
    cannot read still runs the collective."""
    clock = PhaseClock()
    monkeypatch.setattr(phases, "CLOCK", clock)
    funcol = SimpleNamespace()
    funcol.all_reduce = lambda self, op, group, tag="": self.clone()
    funcol.all_gather_single = lambda self, dim, group, tag="": torch.cat([self] * len(group))
    funcol.all_gather_tensor = lambda self, dim, group, tag="": funcol.all_gather_single(
        self, dim, group, tag
    )
    collectives.module_timed(funcol, collectives.FUNCTIONAL_SENDS)
    x = torch.zeros(10)  # 40 bytes
    funcol.all_reduce(x, "sum", [[0, 1], [2, 3]])  # two groups of 2: 2(2-1)/2 x 40
    assert clock.read()[-1] == 40
    assert funcol.all_gather_tensor(x, 0, group=[0, 1, 2]).numel() == 30  # (3-1) x 40, once
    assert clock.read()[-1] == 40 + 80
    assert funcol.all_reduce(x, "sum", object()) is not None  # uncountable group: runs, 0 bytes
    assert clock.read()[-1] == 120
    assert clock.read()[CLOCK_PHASES.index("communication")] > 0


class _MovedTimer:
    """A device-like timer on a timeline the test moves: its marks are the times they were taken
    at, read (``seconds``) only after ``wait``, as a CUDA event's are."""

    on_device = True

    def __init__(self, now: list[float]) -> None:
        self.now, self.waits, self.unready_reads = now, 0, 0
        self._ready_until = -1.0

    def mark(self) -> float:
        return self.now[0]

    def seconds(self, start: float, end: float) -> float:
        self.unready_reads += end > self._ready_until  # an event not waited for yet
        return end - start

    def wait(self, last: float) -> None:
        self.waits += 1
        self._ready_until = last


def _two_windows(clock: PhaseClock, spend: Any) -> list[tuple[float, ...]]:
    """A window with nested phases and two hand-overs (the first not the last: backward goes on
    after it), then a second window; the clock read after each."""
    reads = []
    with clock.phase("forward"):
        spend(0.1)
        with clock.phase("communication"):  # a synchronous collective inside forward (FSDP)
            spend(0.05)
        spend(0.02)
    with clock.phase("backward"):
        spend(0.2)
        for wait in (0.3, 0.04):  # two buckets: backward computes on, then waits
            with clock.phase("communication"):
                spend(0.01)
            clock.handed_over()
            spend(wait)
    spend(0.5)  # between phases: nobody's
    with clock.phase("optimizer"):
        spend(0.03)
    reads.append(clock.read())
    with clock.phase("backward"):
        spend(0.1)
        clock.handed_over()
        with clock.phase("optimizer"):  # a phase nested after the hand-over keeps its own time
            spend(0.01)
        spend(0.02)
    reads.append(clock.read())
    return reads


# forward, backward, optimizer, communication, bytes: the totals after each window.
TWO_WINDOWS = [(0.12, 0.5, 0.03, 0.11, 0.0), (0.12, 0.6, 0.04, 0.13, 0.0)]


def test_the_host_clock_and_a_device_clock_charge_one_timeline_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same timeline on the host's timer (its seconds added at once) and on a device-like
    one (its segments kept and added up when read, after one wait for the last mark): the same
    totals, window by window, and the device's marks are never read before they were waited
    for."""
    now = [100.0]
    monkeypatch.setattr(phases, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    def spend(seconds: float) -> None:
        now[0] += seconds

    host = _two_windows(PhaseClock(), spend)
    device_timer = _MovedTimer(now)
    device = _two_windows(PhaseClock(device_timer), spend)
    for found in (host, device):
        for window, expected in zip(found, TWO_WINDOWS, strict=True):
            assert window == pytest.approx(expected)
    assert device_timer.waits == 2 and device_timer.unready_reads == 0


def test_a_device_clock_waits_for_nothing_until_it_is_read() -> None:
    now = [0.0]
    timer = _MovedTimer(now)
    clock = PhaseClock(timer)
    for _ in range(3):
        with clock.phase("forward"):
            now[0] += 1
        with clock.phase("backward"):
            now[0] += 2
    assert timer.waits == 0  # phase changes queue marks only
    assert clock.read()[:2] == (3.0, 6.0) and timer.waits == 1
    assert clock.read()[:2] == (3.0, 6.0) and timer.waits == 1  # nothing new: no wait


def _in_thread(clock: PhaseClock, now: list[float]) -> None:
    def hook() -> None:  # as DDP's hook: its call, then its hand-over
        with clock.phase("communication"):
            now[0] += 1
        clock.handed_over()

    worker = threading.Thread(target=hook)
    with clock.phase("backward"):
        worker.start()
        worker.join()
        now[0] += 2


def test_another_thread_keeps_time_on_a_device_clock_not_on_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU DDP's hooks run on autograd's device thread, their marks on the stream: they
    count. On the CPU another thread (Gloo's) would count time the rank's own thread counts."""
    now = [0.0]
    monkeypatch.setattr(phases, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    device = PhaseClock(_MovedTimer(now))
    _in_thread(device, now)
    assert device.read() == (0.0, 0.0, 0.0, 3.0, 0.0)  # the hook's, and the wait after it
    now[0] = 0.0
    host = PhaseClock()
    _in_thread(host, now)
    assert host.read() == (0.0, 3.0, 0.0, 0.0, 0.0)  # the thread's phases were not timed


def test_a_cuda_clock_marks_the_runs_device_not_the_current_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-process run on the second GPU (``--gpus 1``) keeps GPU 0 as torch's current
    device: its marks must go on its own device's stream (faked here: no GPU needed)."""
    recorded: list[Any] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self, stream: Any = None) -> None:
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream", device))
    clock = PhaseClock()
    monkeypatch.setattr(phases, "CLOCK", clock)
    phases.clock_for(torch.device("cuda", 1))
    with clock.phase("forward"):
        pass
    assert recorded == [("stream", torch.device("cuda", 1))] * 2


# ---- real runs ----------------------------------------------------------------------------


def _run(sample_data: Path, *strategy: str, epochs: int = 1) -> Result:
    result = run_cli(
        sample_data, "--strategy", *strategy, "--epochs", str(epochs),
        "--steps-per-epoch", str(STEPS), "--log-interval", str(INTERVAL), "--run-id", "phases",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_no_phases_reports_none_and_ddp_still_trains(sample_data: Path) -> None:
    """--no-phases (what the overhead bench compares with): the ranks' reports carry no phase
    and no bytes; the rest is reported as before. The run also asks for a target it cannot reach
    (an accuracy of 1): it trains every epoch planned (tests/test_training_target.py's check,
    made on this run rather than on a DDP run of its own)."""
    never = ("--target-accuracy", "1")
    result = _run(sample_data, "ddp", "--nproc", "2", "--no-phases", *never, epochs=2)
    for _, rank in phase_windows(result):
        assert not {*SECONDS[1:], "communication_bytes"} & rank.keys(), rank
        assert rank["images_per_second"] > 0 and "data_seconds" in rank
    assert_trained_every_epoch(result, epochs=2)


def test_fsdp_phases_add_up_and_count_its_gathers(sample_data: Path) -> None:
    """FSDP2's all-gathers and reduce-scatters are synchronous on Gloo: all communication.
    Each step all-gathers every parameter twice (forward, and again for backward after
    resharding) and reduce-scatters every gradient: over 2 ranks about 1.5x the model's bytes
    (the shards are padded, so at least that)."""
    result = _run(sample_data, "fsdp", "--nproc", "2")
    assert_phases_add_up(result)
    gradient_bytes = 4 * result.started["model_info"]["parameters"]
    for steps, rank in phase_windows(result):
        assert rank["communication_seconds"] > 0
        assert 1.5 * steps * gradient_bytes <= rank["communication_bytes"]
        assert rank["communication_bytes"] <= 1.6 * steps * gradient_bytes


def _stage_boundary_floats() -> int:
    """The floats an image's activations hold between simple-cnn's two pipeline stages (as the
    pipeline strategy cuts it), from the model itself in the test process."""
    model = SimpleCNN()
    stages = stages_split(model_stages("simple-cnn", model, stages=2, strategy="pipeline"), 2)
    with torch.no_grad():
        return stage_modules(model, stages)[0](torch.zeros(1, 1, 28, 28)).numel()


@pytest.mark.django_db
def test_a_pipeline_times_its_stages_chunks_and_waits_and_counts_their_sends(
    sample_data: Path, experiment_factory: Any, user_factory: Any
) -> None:
    """Each rank's schedule: its stage's forward and backward chunks are forward and backward,
    its sends, receives and waits for the other stage communication, and what is left (the
    schedule's bookkeeping) is under the bound. Pipelining hands torch's own isend/irecv to
    P2POp, which refuses any other function: their batches and waits are what is timed. A step
    sends the batch's activations at the stage boundary forward (rank 0) and their gradients
    back (rank 1), float32; the ranks' all-reduce of a pending checkpoint request and the loss's
    broadcast add a few bytes (the first step: the stages' shapes too)."""
    result = _run(sample_data, "pipeline", "--nproc", "2")
    assert_phases_add_up(result)
    batch, windows = result.started["batch_size"], phase_windows(result)
    assert {rank["rank"] for _, rank in windows} == {0, 1}, windows
    boundary = 4 * batch * _stage_boundary_floats()
    for steps, rank in windows:
        assert rank["communication_seconds"] > 0 and rank["optimizer_seconds"] > 0, rank
        assert steps * boundary <= rank["communication_bytes"], rank
    for steps, rank in windows[2:]:  # after the first step
        assert rank["communication_bytes"] <= steps * (boundary + 64), rank
    # Stored as the supervisor stores them, the stages' windows name no slow rank (issue 34
    # item 8): where one stage takes markedly longer, it is said as the split's imbalance.
    run = experiment_factory(owner=user_factory(), strategy="pipeline", status="running")
    sink = EventSink(run)
    for event in result.events:
        sink.add(event)  # type: ignore[arg-type]
        events_flush(sink=sink)
    said = LogLine.objects.filter(experiment=run, level="warning").values_list("message", flat=True)
    assert not [m for m in said if "slower than" in m], list(said)
    run.refresh_from_db()
    assert run.straggler_text == "" or run.straggler_text.startswith("stage "), run.straggler_text


@pytest.mark.gpu
@needs_cuda
def test_a_single_run_on_cuda_times_its_phases_with_events_and_they_add_up(
    sample_data: Path,
) -> None:
    result = _run(sample_data, "single", "--gpus", "0")
    assert result.started["device"] == "cuda:0"
    assert_phases_add_up(result)


@pytest.mark.gpu
@needs_cuda
def test_phase_changes_on_cuda_never_wait_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real step on a GPU, counted in this process: no ``torch.cuda.synchronize`` at all,
    and the clock's one wait (its last event's) comes when the meter reads it."""
    calls = {"synchronize": 0, "event": 0}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(torch.cuda, "synchronize", counted("synchronize", torch.cuda.synchronize))
    monkeypatch.setattr(
        torch.cuda.Event, "synchronize", counted("event", torch.cuda.Event.synchronize)
    )
    clock = PhaseClock(phases.CudaTimer())
    monkeypatch.setattr(phases, "CLOCK", clock)  # what step_default's phases charge
    device = torch.device("cuda:0")
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    step = step_default(net, torch.optim.SGD(net.parameters(), lr=0.01))
    x, y = torch.randn(256, 1, 28, 28, device=device), torch.randint(0, 10, (256,), device=device)
    for _ in range(20):
        step(x, y)
    assert calls == {"synchronize": 0, "event": 0}
    forward, backward, optimizer, communication, _ = clock.read()
    assert calls == {"synchronize": 0, "event": 1}
    assert forward > 0 and backward > 0 and optimizer > 0 and communication == 0


# ---- the dashboard ------------------------------------------------------------------------


def _ranks(forward: float) -> list[dict[str, Any]]:
    return [
        {"rank": r, "images_per_second": 50.0, "data_seconds": 0.1, "compute_seconds": 0.6,
         "rss_bytes": 1000, "forward_seconds": forward, "backward_seconds": 0.3,
         "optimizer_seconds": 0.1, "communication_seconds": 0.2 * r, "other_seconds": 0.05,
         "communication_bytes": 4000 * r}
        for r in (0, 1)
    ]  # fmt: skip


@pytest.mark.django_db
def test_the_sink_stores_the_phases_and_the_read_json_breaks_them_down(
    experiment_factory: Any, user_factory: Any
) -> None:
    owner = user_factory()
    run = experiment_factory(owner=owner)
    api = Client()
    api.force_login(owner)
    assert api.get(f"/api/experiments/{run.pk}/").json()["breakdown"] == []  # no phases yet
    sink = EventSink(run)
    for step, forward in ((1, 0.2), (2, 0.4)):
        sink.add({"type": "step", "epoch": 1, "step": step, "time": float(step),
                  "train_loss": 2.0, "images_per_second": 100.0, "ranks": _ranks(forward)})  # type: ignore[typeddict-item]  # fmt: skip
    sink.flush()
    stored = {(p.key, p.step): p.value for p in SeriesPoint.objects.filter(experiment=run)}
    for name in (*SECONDS[1:], "communication_bytes"):
        assert (f"rank/1/{name}", 2) in stored, name
    assert stored[("rank/1/communication_bytes", 2)] == 4000
    assert stored[("rank/0/forward_seconds", 1)] == 0.2

    body = api.get(f"/api/experiments/{run.pk}/").json()
    breakdown = body["breakdown"]
    assert [entry["rank"] for entry in breakdown] == [0, 1]
    for entry in breakdown:
        assert abs(sum(entry[name] for name in PHASES) - 1) <= 0.05
    # Rank 1 over both steps: data 0.2, forward 0.6, backward 0.6, optimizer 0.2,
    # communication 0.4, other 0.1 of 2.1 s.
    assert breakdown[1]["communication"] == pytest.approx(0.4 / 2.1, abs=1e-3)
    assert breakdown[0]["communication"] == 0
    # Rank 1 only waits longer in its collectives: no straggler.
    assert body["straggler"] is None
    # The metrics API carries the series as any other.
    series = api.get(f"/api/experiments/{run.pk}/metrics/").json()["series"]
    assert {f"rank/{r}/{name}" for r in (0, 1) for name in SECONDS} <= series.keys()


def _step(step: int, forwards: list[float]) -> dict[str, Any]:
    """A step event whose ranks differ in forward time; communication fills the wall (0.5 s)."""
    ranks = [
        {"rank": r, "images_per_second": 50.0, "data_seconds": 0.0, "compute_seconds": 0.0,
         "rss_bytes": 1, "forward_seconds": f, "backward_seconds": 0.1, "optimizer_seconds": 0.0,
         "communication_seconds": 0.4 - f, "other_seconds": 0.0, "communication_bytes": 0}
        for r, f in enumerate(forwards)
    ]  # fmt: skip
    return {"type": "step", "epoch": 1, "step": step, "time": float(step), "train_loss": 1.0,
            "images_per_second": 150.0, "ranks": ranks}  # fmt: skip


@pytest.mark.django_db
def test_a_rank_markedly_slower_than_the_others_is_named_an_even_run_names_nobody(
    experiment_factory: Any, user_factory: Any
) -> None:
    owner = user_factory()
    even, uneven = experiment_factory(owner=owner), experiment_factory(owner=owner)
    for run, slow in ((even, 0.11), (uneven, 0.3)):
        sink = EventSink(run)
        for step in range(1, 9):
            # From step 3 rank 2 is slow (uneven): busy 0.4 s against the others' 0.2 s.
            sink.add(_step(step, [0.1, 0.1, slow if step >= 3 else 0.1]))  # type: ignore[arg-type]
        sink.flush()
    assert experiment_straggler(experiment=even) is None
    named = experiment_straggler(experiment=uneven)
    # Over the 8 windows: (2 x 0.2 + 6 x 0.4) / (8 x 0.2) - 1.
    assert named == {"rank": 2, "slower_by": 0.75, "since_step": 3, "late_seconds": None}


def _arrived(event: dict[str, Any], late: list[float], collectives: int = 4) -> dict[str, Any]:
    """``event`` with each rank's arrival (protocol 1.14): seconds late per collective."""
    for rank, seconds in zip(event["ranks"], late, strict=True):
        rank.update(arrived_late_seconds=seconds, collectives=collectives)
    return event


@pytest.mark.django_db
def test_the_busiest_rank_is_named_where_it_also_arrives_last_with_how_late(
    experiment_factory: Any, user_factory: Any
) -> None:
    """From step 3 rank 2 is busy 0.4 s against the others' 0.2 s (1x slower). Where it also
    comes to each of its 4 collectives 0.1 s after the others it is named, with that; where the
    collectives wait for rank 0 instead (busy time's noise, not the straggler), nobody is; where
    one window says no arrivals (a run before 1.14), busy time alone names it."""
    owner = user_factory()
    runs = {name: experiment_factory(owner=owner) for name in ("last", "other", "mixed")}
    for name, run in runs.items():
        sink = EventSink(run)
        for step in range(1, 9):
            event = _step(step, [0.1, 0.1, 0.3 if step >= 3 else 0.1])
            late = [-0.05, -0.05, 0.1] if step >= 3 else [0.0005, 0.0005, -0.001]
            if name == "other":
                late = late[::-1]
            if name != "mixed" or step > 1:
                event = _arrived(event, late)
            sink.add(event)  # type: ignore[arg-type]
        sink.flush()
    named = experiment_straggler(experiment=runs["last"])
    # Late 6 x 4 x 0.1 - 2 x 4 x 0.001 s over 32 collectives.
    assert named == {"rank": 2, "slower_by": 0.75, "since_step": 3, "late_seconds": 0.0747}
    text = straggler_text(
        named, context=straggler_context(experiment=runs["last"], straggler=named)
    )
    said = "rank 2 is 1.8x slower than the median since step 3: it reaches each collective 75 ms"
    assert text.startswith(f"{said} after the others; the others spend "), text
    assert experiment_straggler(experiment=runs["other"]) is None
    assert experiment_straggler(experiment=runs["mixed"]) == {
        "rank": 2, "slower_by": 0.75, "since_step": 3, "late_seconds": None
    }  # fmt: skip


def test_a_phase_the_others_spend_no_time_in_is_said_in_seconds() -> None:
    """A rank paused in the script's own code between steps (`other`, where the others spend
    none): its extra time there is named in seconds, as no ratio is."""
    named = {"rank": 1, "slower_by": 0.9, "since_step": 29, "late_seconds": 0.009}
    context = StragglerContext(others_share=0.13, phase=("other", None, 0.42), other_stages=None)
    assert straggler_text(named, context=context) == (  # type: ignore[arg-type]
        "rank 1 is 1.9x slower than the median since step 29: it reaches each collective 9 ms "
        "after the others; the others spend 13% of their time waiting for it in communication; "
        "its other takes 420 ms more than theirs"
    )


def test_lateness_is_against_the_median_of_the_others_and_only_for_the_same_collectives() -> None:
    assert phases.lateness([(3, 100.0), (3, 100.5), (3, 100.1)]) == pytest.approx(
        [-0.3, 0.45, -0.15]
    )
    assert phases.lateness([(3, 100.0), (3, 100.25)]) == [-0.25, 0.25]
    assert phases.lateness([(3, 100.0), (2, 100.25)]) is None  # not the same collectives
    assert phases.lateness([(0, 0.0), (0, 0.0)]) is None
    assert phases.lateness([(3, 100.0)]) is None


def test_the_engine_and_the_dashboard_name_the_same_phases_in_the_same_order() -> None:
    # Two homes on either side of the event protocol (the web server never imports torch).
    assert phases.PHASES == PHASES


@pytest.mark.django_db
def test_a_named_rank_stays_named_until_it_is_barely_slower(
    experiment_factory: Any, user_factory: Any
) -> None:
    """The bar to clear is lower than the bar to name: rank 2 named at 2x, then 1.4x slower (below
    the 1.5x that names) stays named; 1.1x clears it. Nobody names a 1.4x rank afresh."""
    run = experiment_factory(owner=user_factory())
    sink = EventSink(run)
    for step in range(1, 21):  # busy 0.4 s against the others' 0.2 s
        sink.add(_step(step, [0.1, 0.1, 0.3]))  # type: ignore[arg-type]
    events_flush(sink=sink)  # as the supervisor flushes: the straggler is looked for after
    assert experiment_straggler(experiment=run) == {
        "rank": 2,
        "slower_by": 1.0,
        "since_step": 1,
        "late_seconds": None,
    }
    for step in range(21, 41):  # busy 0.28 s
        sink.add(_step(step, [0.1, 0.1, 0.18]))  # type: ignore[arg-type]
    events_flush(sink=sink)
    assert experiment_straggler(experiment=run) is None
    kept = experiment_straggler(experiment=run, named=2)
    assert kept == {"rank": 2, "slower_by": 0.4, "since_step": 21, "late_seconds": None}
    assert experiment_straggler(experiment=run, named=0) is None
    run.refresh_from_db()
    assert run.straggler_rank == 2  # kept named: no line, no message
    for step in range(41, 61):  # busy 0.22 s
        sink.add(_step(step, [0.1, 0.1, 0.12]))  # type: ignore[arg-type]
    events_flush(sink=sink)
    assert experiment_straggler(experiment=run, named=2) is None
    run.refresh_from_db()
    assert run.straggler_rank is None
    said = LogLine.objects.filter(experiment=run, message__regex=r"^rank 2 is ").values_list(
        "message", flat=True
    )
    assert [m.split(" ", 4)[3] for m in said] == ["2.0x", "no"], list(said)
    # Four ranks: rank 2 is 1.35x, rank 3 1.45x the median. Rank 2, named, is not kept while
    # another is slower: the banner names the slowest or none.
    four = experiment_factory(owner=run.owner)
    sink = EventSink(four)
    for step in range(1, 21):
        sink.add(_step(step, [0.1, 0.1, 0.17, 0.19]))  # type: ignore[arg-type]
    sink.flush()
    assert experiment_straggler(experiment=four, named=3) == {
        "rank": 3, "slower_by": 0.45, "since_step": 1, "late_seconds": None
    }  # fmt: skip
    assert experiment_straggler(experiment=four, named=2) is None


def _cadence(forwards_at: dict[int, list[float]]) -> list[dict[str, Any]]:
    """The engine's cadence (issue 34 item 8): step 1 reported alone, then every 10 steps."""
    return [_step(step, forwards) for step, forwards in forwards_at.items()]


@pytest.mark.django_db
def test_the_warm_up_window_names_nobody(experiment_factory: Any, user_factory: Any) -> None:
    """A cold start's step 1, reported alone, where rank 0 took 3x the others (its first
    allocations and connections), is the warm-up: nobody is named at step 1 nor after it. A
    rank slow from step 10 on is named, since step 10."""
    owner = user_factory()
    cold, slow = experiment_factory(owner=owner), experiment_factory(owner=owner)
    even, rank0_cold = [0.1, 0.1, 0.1], [0.3, 0.1, 0.1]
    sink = EventSink(cold)
    for event in _cadence({1: rank0_cold, 10: even, 20: even}):
        sink.add(event)  # type: ignore[arg-type]
        events_flush(sink=sink)
        assert experiment_straggler(experiment=cold) is None, event["step"]
    cold.refresh_from_db()
    assert cold.straggler_rank is None
    assert not LogLine.objects.filter(experiment=cold, message__contains="slower").exists()
    sink = EventSink(slow)
    for event in _cadence({1: even, 10: [0.1, 0.1, 0.3], 20: [0.1, 0.1, 0.3]}):
        sink.add(event)  # type: ignore[arg-type]
    sink.flush()
    assert experiment_straggler(experiment=slow) == {
        "rank": 2, "slower_by": 1.0, "since_step": 10, "late_seconds": None
    }  # fmt: skip


@pytest.mark.django_db
def test_a_pipelines_busiest_stage_is_said_as_the_splits_imbalance(
    experiment_factory: Any, user_factory: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """On a pipeline each rank is a stage: the one the split gave more work is not a slow
    rank. Said as the stages' imbalance on the row, in the log and the read JSON's rank; no
    notification (nothing is wrong with a machine)."""
    owner = user_factory(email="owner@example.com")
    NotificationSettings.objects.create(  # verified: a straggler's mail would reach it
        user=owner, email_enabled=True, straggler_enabled=True, email_verified=owner.email
    )
    run = experiment_factory(owner=owner, strategy="pipeline", processes=2, status="running")
    sink = EventSink(run)
    with django_capture_on_commit_callbacks(execute=True):  # a notification would go here
        for step in range(1, 11):  # stage 0 busy 0.46 s a step, stage 1 0.2 s
            sink.add(_step(step, [0.36, 0.1]))  # type: ignore[arg-type]
            events_flush(sink=sink)
    run.refresh_from_db()
    assert run.straggler_rank == 0
    assert run.straggler_text == "stage 0 takes 2.3x stage 1: the split is unbalanced"
    assert LogLine.objects.filter(experiment=run, message=run.straggler_text).count() == 1
    assert not LogLine.objects.filter(experiment=run, message__contains="slower").exists()
    assert mail.outbox == []
    named = experiment_straggler(experiment=run)
    assert named is not None  # three stages: against their median
    said = stage_imbalance_text(named, other_stages=(1, 2))
    assert said == "stage 0 takes 2.3x the other stages: the split is unbalanced"
