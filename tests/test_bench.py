"""Smoke runs of the engine benchmarks (``python -m training.bench``), each as
docs/performance.md documents it (its defaults) but with tiny step counts and two rounds (seeds)
where it has them: each must run to its end and print its ratio as the last line. Their values
are measured by running the commands (docs/performance.md), not here: timings on a shared CI
machine mean nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from tests.few_digits import (
    fashion_few_tests_write,
    sample_data_few,  # noqa: F401 (the sample_data fixture)
)
from tests.test_training import ROOT
from training.bench import parity, phases
from training.data.idx_files import DEBIAN_FASHION_DIR
from training.models.simple_cnn import SimpleCNN
from training.registry import ENGINE_STRATEGIES

RATIO = re.compile(r"^(engine|memory|parity|phases|script|observe|log) ratio: \d+\.\d{3}$")


pytestmark = pytest.mark.usefixtures("no_processes_left")


def bench(sample_data: Path, *args: str) -> list[str]:
    env = dict(os.environ, TRAINYARD_NO_DOWNLOAD="1", TRAINYARD_DATA_DIR=str(sample_data))
    proc = subprocess.run(
        [sys.executable, "-m", "training.bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


@pytest.mark.slow  # a whole benchmark run
def test_engine_bench_prints_its_ratio(sample_data: Path) -> None:
    # The default data set: Fashion-MNIST where Debian's package is installed, as a user gets;
    # the image-folder workload is the next test's (both, as by default: tests/test_gpu_check.py).
    lines = bench(sample_data, "engine", "--workload", "idx", "--steps", "2", "--rounds", "2")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("engine ratio: ")
    table = "\n".join(lines)
    for loop in ("ours", "dataloader", "compute"):
        assert re.search(rf"^{loop} +\d+\.\d", table, re.MULTILINE)
    assert "ours / dataloader loop:" in table


def test_engine_bench_image_folder_workload(sample_data: Path) -> None:
    """The second workload, small: 200 real MNIST-sample digits written as PNG files, the
    engine's resident and streaming paths beside a plain ImageFolder + DataLoader loop."""
    lines = bench(
        sample_data, "engine", "--workload", "imagefolder", "--dataset", "mnist",
        "--folder-per-class", "20", "--steps", "2", "--rounds", "2", "--folder-workers", "1",
    )  # fmt: skip
    assert re.match(r"^imagefolder ratio: \d+\.\d{3}$", lines[-1])
    table = "\n".join(lines)
    for loop in ("resident", "streaming", "imagefolder"):
        assert re.search(rf"^{loop} +\d+\.\d", table, re.MULTILINE)
    assert "streaming / resident:" in table and "engine ratio" not in table
    assert len(list(sample_data.glob("bench-imagefolder-mnist-20/train/class_*/*.png"))) == 200


@pytest.mark.slow  # four short trainings, two of them 2 ranks
def test_phases_bench_prints_each_strategy_with_and_without_the_clock(sample_data: Path) -> None:
    """Single and DDP x2, each with the phase clock and with --no-phases; the ratio of each."""
    lines = bench(sample_data, "phases", "--dry-run")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("phases ratio: "), lines
    at = next(i for i, line in enumerate(lines) if line.startswith(phases.BREAKDOWN_HEADER))
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:at]}
    assert rows.keys() == {"single", "ddp"}, lines
    assert lines[at + 1].split() == ["strategy", "rank", *phases.PHASES, "bytes/step"]
    shares = {(row[0], int(row[1])): row[2:] for row in map(str.split, lines[at + 2 : -1])}
    assert shares.keys() == {("single", 0), ("ddp", 0), ("ddp", 1)}, lines
    for figures in shares.values():
        assert sum(map(float, figures[:-1])) == pytest.approx(100, abs=0.5)
    # Single sends nothing; each DDP rank sends the ring's 2(N-1)/N of its gradients' bytes.
    assert float(shares["single", 0][4]) == 0 and int(shares["single", 0][-1]) == 0
    gradient_bytes = 4 * sum(p.numel() for p in SimpleCNN().parameters())
    for rank in (0, 1):
        assert float(shares["ddp", rank][4]) > 0
        assert int(shares["ddp", rank][-1]) == pytest.approx(gradient_bytes, rel=0.01)
    for with_, without, ratio, spread in rows.values():
        assert float(with_) > 0 and float(without) > 0
        # One round: its ratio is the median's, and the two medians' ratio.
        assert spread == f"{ratio}-{ratio}"
        assert float(ratio) == pytest.approx(float(with_) / float(without), rel=0.01)
    assert float(lines[-1].split()[-1]) == min(float(r[2]) for r in rows.values())


@pytest.mark.slow  # a whole benchmark run
def test_memory_bench_prints_its_ratio(sample_data: Path) -> None:
    """Four trainings, single and hogwild each on Debian's Fashion-MNIST (its 60,000 training
    images, 1,000 of its test images: each run evaluates on all of them) and on the sample,
    every process's memory sampled meanwhile. ddp, the other default, took 185 s of the 300 that
    all six took on the loaded 2-core development machine; its ranks' one shared copy of the data
    is tests/test_training.py's test_ddp_two_cpu_ranks, and one loop measures every strategy."""
    need(DEBIAN_FASHION_DIR.is_dir(), "Debian's dataset-fashion-mnist is not installed")
    fashion_few_tests_write(sample_data / "FashionMNIST" / "raw")
    # hogwild: its processes are spawned by the training itself, not started by a launcher, so
    # the sampler must find them under the run's process.
    lines = bench(sample_data, "memory", "--steps", "1", "--strategies", "hogwild")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("memory ratio: ")
    ratios = [re.match(r"^hogwild x2 / single: data footprint ratio (\d+\.\d{3}) ", line)
              for line in lines]  # fmt: skip
    found = [r[1] for r in ratios if r]
    assert not any(line.startswith("ddp") for line in lines), lines
    # The last line is the largest ratio, of the one strategy asked for.
    assert found == [lines[-1].split()[-1]], lines


@pytest.mark.slow  # a whole benchmark run
def test_parity_bench_prints_its_table_and_ratio(sample_data: Path) -> None:
    lines = bench(
        sample_data,
        "parity",
        "--seeds",
        "1,2",
        "--steps-per-epoch",
        "3",
        "--strategies",
        "single,ddp,ddp:accumulate=2",
    )
    assert RATIO.match(lines[-1]) and lines[-1].startswith("parity ratio: ")
    table = "\n".join(lines)
    head = (
        r"^strategy +batch/proc +procs +seed 1 +seed 2 +mean +spread +vs single +vs plain +margin$"
    )
    assert re.search(head, table, re.M)
    acc = r"[01]\.\d{4}"
    # Two seeds: two accuracies, their mean and their spread (no longer 0 by construction).
    assert re.search(rf"^single +64 +1 +{acc} +{acc} +{acc} +{acc} +\+0\.0000 +- +-$", table, re.M)
    ddp = re.search(rf"^ddp +32 +2 +({acc} +{acc}) +{acc} +{acc} +[+-]{acc} +- +-$", table, re.M)
    # Two batches of 16 a step on each rank: the very images of ddp's 32, so its accuracies.
    row = rf"^ddp accumulate=2 +16 +2 +({acc} +{acc}) +{acc} +{acc} +[+-]{acc} +\+0\.0000 +within$"
    accumulated = re.search(row, table, re.M)
    assert ddp and accumulated and accumulated[1] == ddp[1], table


@pytest.mark.slow  # five trainings of 3 steps, four of them 2 ranks (26 s on 2 idle cores)
def test_parity_bench_ddp_variants_margin_and_figures_per_rank(sample_data: Path) -> None:
    """DDP's communication options beside plain ddp (added though not listed), each judged
    against it; the bf16 hook skipped with the registry's reason; the second table's figures
    taken from the runs' epoch events."""
    lines = bench(
        sample_data, "parity", "--seeds", "1", "--steps-per-epoch", "3", "--strategies",
        "single,ddp:comm_hook=fp16,ddp:shard_optimizer,ddp:comm_hook=bf16",
    )  # fmt: skip
    assert RATIO.match(lines[-1]) and lines[-1].startswith("parity ratio: ")
    table = "\n".join(lines)
    acc = r"[01]\.\d{4}"
    assert re.search(rf"^ddp +32 +2 +{acc} +{acc} +0\.0000 +[+-]{acc} +- +-$", table, re.M), table
    verdicts = {}
    for label in ("ddp comm_hook=fp16", "ddp shard_optimizer"):
        row = rf"^{label} +32 +2 +{acc} +{acc} +0\.0000 +[+-]{acc} +([+-]{acc}) +(within|OUTSIDE)$"
        found = re.search(row, table, re.M)
        assert found, table
        assert (abs(float(found[1])) <= 0.02) == (found[2] == "within"), found[0]
        verdicts[label] = found[2] == "within"
    assert re.search(
        r"^ddp comm_hook=bf16 +32 +2 skipped: --comm-hook bf16: .*Gloo.*NCCL", table, re.M
    ), table
    within = sum(verdicts.values())
    margin = f"margin 0.0200 (2 accuracy points) of the plain strategy's mean: {within} of 2 "
    assert any(line.startswith(margin) for line in lines), table
    # Throughput and memory per rank: positive images/s, sizes in binary units, ratios to single.
    head = r"^strategy +images/s +x single +params +grads +optimizer +state x single +peak$"
    assert re.search(head, table, re.M), table
    size = r"\d+(?:\.\d)? (?:B|KiB|MiB|GiB)"
    figures = {}
    for label in ("single", "ddp", "ddp comm_hook=fp16", "ddp shard_optimizer"):
        sizes = rf"({size}) +({size}) +({size})"
        row = rf"^{label} +(\d+\.\d) +(\d+\.\d\d) +{sizes} +(\d+\.\d\d) +({size})$"
        found = re.search(row, table, re.M)
        assert found and float(found[1]) > 0, (label, table)
        figures[label] = found.groups()
    assert figures["single"][1] == "1.00" and figures["single"][5] == "1.00"
    # Every DDP rank holds the whole model: single's parameters, gradients and (plain) state.
    assert figures["ddp"][2:5] == figures["single"][2:5]
    assert figures["ddp comm_hook=fp16"][2:4] == figures["single"][2:4]
    assert re.search(r"^ddp comm_hook=bf16 +skipped$", table, re.M)
    # ZeRO-1's ranks keep different shares of the optimizer state: each rank's line says so.
    ranks = re.search(
        rf"^  ddp shard_optimizer: rank 0 {size} / {size} / ({size}); rank 1 {size} / {size} / "
        rf"({size}) \(params / grads / optimizer\)$",
        table,
        re.M,
    )
    assert ranks and ranks[1] != ranks[2], table


def test_parity_variants_parse_plan_and_judge() -> None:
    """Without training: the variant syntax (a switch by its name or =true), each variant's plain
    strategy added before it, the registry's refusal as the skip reason, the margin verdict."""
    switch = parity.variant_parse("ddp:shard_optimizer")
    assert switch == parity.variant_parse("ddp:shard_optimizer=TRUE")
    assert switch.label == "ddp shard_optimizer" and switch.flags() == ["--shard-optimizer"]
    assert parity.variant_parse("ddp:shard_optimizer=false").flags() == []
    hook = parity.variant_parse("ddp:comm_hook=powersgd:accumulate=2")
    assert hook.flags() == ["--comm-hook", "powersgd", "--accumulate", "2"]
    with pytest.raises(ValueError, match="the communication hook is none or fp16"):
        parity.variant_parse("ddp:comm_hook=int8")
    with pytest.raises(ValueError, match="single takes no option 'comm_hook'"):
        parity.variant_parse("single:comm_hook=fp16")
    for default in parity.DEFAULT_STRATEGIES:  # every default row parses
        parity.variant_parse(default)
    assert {"ddp:comm_hook=fp16", "ddp:comm_hook=powersgd", "ddp:shard_optimizer"} <= set(
        parity.DEFAULT_STRATEGIES
    )
    assert set(ENGINE_STRATEGIES) <= set(parity.DEFAULT_STRATEGIES)  # a new strategy by itself
    args, _, order = parity._args_parse(["--strategies", "ddp:comm_hook=fp16,fsdp:accumulate=2"])
    assert [v.label for v in order] == [
        "single", "ddp", "ddp comm_hook=fp16", "fsdp", "fsdp accumulate=2",
    ]  # fmt: skip
    row, _ = parity._plan(parity.variant_parse("ddp:comm_hook=bf16"), args, gpus=0)
    assert row.problem.startswith("skipped: --comm-hook bf16: ") and "Gloo" in row.problem
    row, flags = parity._plan(switch, args, gpus=0)
    assert not row.problem and flags == ["--nproc", "2", "--shard-optimizer"]
    # simple-cnn cuts into 2 stages: a pipeline of 4 is skipped with the reason, not run to fail.
    four, _, _ = parity._args_parse(["--strategies", "pipeline", "--nproc", "4"])
    row, _ = parity._plan(parity.variant_parse("pipeline"), four, gpus=0)
    assert row.problem.startswith("skipped: ") and "at most 2 stages" in row.problem, row.problem
    plain = parity.Row(parity.Variant("ddp"), 32, 2, [parity.RunResult(0.90, 100.0)])
    means = {plain.variant: plain.mean}
    near = parity.Row(hook, 16, 2, [parity.RunResult(0.885, 90.0)])
    far = parity.Row(switch, 32, 2, [parity.RunResult(0.87, 90.0)])
    assert parity._vs_plain(near, means, 0.02).split() == ["-0.0150", "within"]
    assert parity._vs_plain(far, means, 0.02).split() == ["-0.0300", "OUTSIDE"]
    assert parity._vs_plain(plain, means, 0.02).split() == ["-", "-"]
    assert parity._vs_plain(near, {}, 0.02).split() == ["n/a", "n/a"]
    sizes = [parity.size_text(n) for n in (512, 161_900, 6_503_464, 3 * 2**30)]
    assert sizes == ["512 B", "158.1 KiB", "6.2 MiB", "3.0 GiB"]


@pytest.mark.slow  # a whole benchmark run
def test_script_bench_prints_both_sides_and_its_ratio(sample_data: Path) -> None:
    """A user's DDP script under Trainyard and under bare torchrun, one round each."""
    lines = bench(sample_data, "script", "--dry-run")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("script ratio: "), lines
    medians = {line.split()[0]: float(line.split()[1]) for line in lines[3:5]}
    assert medians.keys() == {"trainyard", "bare"} and min(medians.values()) > 0, lines
    ratio = float(lines[-1].split()[-1])
    assert ratio == pytest.approx(medians["trainyard"] / medians["bare"], abs=0.001)


@pytest.mark.slow  # four short 2-rank trainings
def test_observe_bench_prints_each_script_both_sides_and_its_ratio(sample_data: Path) -> None:
    """The DDP and the FSDP2 script, observed in each rank and bare, one round each: every
    observed run wrote its window events (the benchmark fails otherwise)."""
    lines = bench(sample_data, "observe", "--dry-run")
    assert RATIO.match(lines[-1]) and lines[-1].startswith("observe ratio: "), lines
    rounds = [line.split() for line in lines if line.startswith("round ")]
    assert sorted((r[2], r[3]) for r in rounds) == [
        ("ddp", "bare"), ("ddp", "observed"), ("fsdp", "bare"), ("fsdp", "observed"),
    ], lines  # fmt: skip
    at = lines.index(next(line for line in lines if line.startswith("script ")))
    medians = {(row[0], row[1]): float(row[2]) for row in map(str.split, lines[at + 1 : at + 7])
               if len(row) == 3}  # fmt: skip
    assert len(medians) == 4 and min(medians.values()) > 0, lines
    ratios = {}
    for wrap in ("ddp", "fsdp"):
        ratio = next(line for line in lines if line.startswith(f"observe ratio {wrap}: "))
        ratios[wrap] = float(ratio.split()[-1])
        expected = medians[wrap, "observed"] / medians[wrap, "bare"]
        assert ratios[wrap] == pytest.approx(expected, abs=0.001), lines
    assert float(lines[-1].split()[-1]) == min(ratios.values())


def test_log_bench_prints_microseconds_per_call_and_its_ratio(sample_data: Path) -> None:
    """Trainyard's run.log always; wandb and mlflow where the bench extra is installed."""
    lines = bench(sample_data, "log", "--dry-run")
    rows = {line.split()[0]: line.split()[1] for line in lines[1:-1]}
    assert rows.keys() == {"trainyard", "wandb", "mlflow"}, lines
    ours = float(rows.pop("trainyard"))
    others = [float(figure) for figure in rows.values() if figure != "missing"]
    assert ours > 0 and lines[1].split()[-1] == "1.00x", lines
    if not others:
        assert lines[-1] == "log ratio: none to compare"
        return
    assert RATIO.match(lines[-1]), lines
    assert float(lines[-1].split()[-1]) == pytest.approx(min(others) / ours, rel=0.01)


def test_bench_usage() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "training.bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "engine" in proc.stderr and "memory" in proc.stderr
    assert "parity" in proc.stderr and "phases" in proc.stderr and "script" in proc.stderr
    assert "observe" in proc.stderr
