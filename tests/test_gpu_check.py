"""``.ci/gpu-check``, the prepared device check, tried on the CPU so that it cannot rot between
the rare sessions that are lent a GPU machine: every row's command checked by training's own CLI
for the CPU and for GPU machines (without training: each strategy is trained by its own tests),
and a few rows run for real (one batch per epoch; GPU-only strategies must be refused with their
reason, as the form and the CLI refuse them), the observed script's row among them."""

from __future__ import annotations

import contextlib
import gzip
import importlib.machinery
import importlib.util
import io
import itertools
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import need
from tests.few_digits import fashion_few_tests_write
from tests.test_script_observer import MODEL_BYTES
from training import cli
from training.config import build_parser, parse_args
from training.data import idx_files
from training.registry import ENGINE_STRATEGIES, OPTIONS_DECLARED
from training.text_catalogue import JARGON_DEBIAN, JARGON_ENV

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu-check"

pytestmark = pytest.mark.usefixtures("no_processes_left")


def _script_load() -> ModuleType:
    """The script as a module (its name has no ``.py``), to test its plan without running it."""
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


gpu_check = _script_load()


def fashion_installed() -> bool:
    return all(
        (idx_files.DEBIAN_FASHION_DIR / f"{name}.gz").is_file()
        for name in idx_files.IDX_FILES.values()
    )


# The GPU counts whose plans are checked without GPUs: none (this machine), one, a pair, and the
# counts where fsdp-tp's 2-D mesh fits.
PLANNED_GPUS = (0, 1, 2, 4, 8)
# The rows trained for real: one process, and torchrun's ranks (rank 0 reporting). Their GPU-only
# variants are refused by the CLI in a process of their own, which the check counts as expected.
TRAINED = ("single", "ddp")


def planned_rows(gpus: int) -> list[tuple[str, list[str], str]]:
    """Every row the script plans on a machine with ``gpus`` GPUs: (label, the arguments of
    ``python -m training``, what is expected), each strategy's then each variant's."""
    data = Path("/data")  # read by no check below: the CLI looks only at --data-path
    rows = []
    for strategy in gpu_check.STRATEGIES:
        args, expected = gpu_check.strategy_args(strategy, gpus)
        rows.append((strategy, strategy, args, expected))
    for label, strategy, flags in gpu_check.VARIANTS:
        args, expected = gpu_check.variant_args(strategy, flags, gpus)
        rows.append((label, strategy, args, expected))
    return [
        (label, gpu_check.training_argv(strategy, label, args, data, True), expected)
        for label, strategy, args, expected in rows
    ]


def cli_refusal(argv: list[str], *, gpus: int, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """What ``python -m training argv`` says before it trains, on a machine with ``gpus`` GPUs
    (torch's count is the one thing faked: the machine is outside the test); None where it
    would go on to train."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    parser = build_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            cli.validate_config(parse_args(argv, parser), parser)
    except SystemExit:
        return said.getvalue().strip().splitlines()[-1]
    return None


def test_the_plan_has_every_strategy_and_each_row_is_a_command_the_cli_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without training: on the CPU and on machines of 1 to 8 GPUs, each row the script would
    run is parsed and checked by training's own CLI (its parser, the registry's refusals, the
    machine's GPU count): a row planned to train passes, a row planned to be refused is refused
    for want of GPUs (the script's verdict reads "GPU" in the message), so a plan that a GPU
    machine would refuse fails here first."""
    # Every strategy the engine trains; a user's own script has no model of ours to check.
    assert sorted(gpu_check.STRATEGIES) == sorted(ENGINE_STRATEGIES)
    for gpus in PLANNED_GPUS:
        for label, argv, expected in planned_rows(gpus):
            if expected in ("skipped", "not installed"):
                continue
            refusal = cli_refusal(argv, gpus=gpus, monkeypatch=monkeypatch)
            where = f"{label} on {gpus} GPU(s): {' '.join(argv)}"
            if expected == "trains":
                assert refusal is None, f"{where}: {refusal}"
            else:
                assert expected == "refused" and refusal and "GPU" in refusal, (where, refusal)
            if (label, gpus) == ("dp-primitives", 0):
                assert refusal and "2 or more GPUs" in refusal, refusal
    # Deepspeed is tried where it is installed, as the CLI would run it.
    deepspeed = gpu_check.strategy_args("deepspeed", 0)[1]
    assert (deepspeed == "trains") == cli.deepspeed_available()


def test_the_script_rows_launch_is_one_the_cli_takes_on_every_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script-observer row's launcher command, checked by training's own CLI as the other
    rows' are: on the CPU 2 Gloo ranks, on GPUs a rank per GPU (two at most) with the script on
    CUDA; the script's images a whole number of its batches a rank, a window's worth or more."""
    code = tmp_path / "code"
    code.mkdir()
    for path in gpu_check.SCRIPT_FILES:  # the files it copies, where it copies them
        (code / Path(path).name).write_text((ROOT / path).read_text())
    for gpus in PLANNED_GPUS:
        for dry_run in (True, False):
            argv = gpu_check.script_argv(code, tmp_path / "checkpoints", gpus, dry_run)
            refusal = cli_refusal(argv, gpus=gpus, monkeypatch=monkeypatch)
            assert refusal is None, (gpus, argv, refusal)
            cfg = parse_args(argv, build_parser())
            assert cfg.script is not None and cfg.nproc == (min(gpus, 2) or 2)
            assert list(cfg.gpus) == (list(range(cfg.nproc)) if gpus else [])
            script = dict(zip(cfg.script.args[::2], cfg.script.args[1::2], strict=True))
            assert script["--device"] == ("cuda" if gpus else "cpu")
            assert script["--wrap"] == "ddp" and script["--epochs"] == "1"
            assert int(script["--batch-size"]) == gpu_check.SCRIPT_BATCH
            steps, rest = divmod(int(script["--images"]), cfg.nproc * gpu_check.SCRIPT_BATCH)
            assert rest == 0 and steps > gpu_check.SCRIPT_EVERY, (gpus, dry_run, steps)


@dataclass(frozen=True)
class Checked:
    """One run of the check (``checked``): its process, its --out folder, its summary's lines
    and its table's rows by label."""

    proc: subprocess.CompletedProcess[str]
    out: Path
    summary: list[str]
    rows: dict[str, str]


LM_LABELS = [row[0] for row in gpu_check.LM_ROWS]


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    """The script run as on a GPU machine, once for the tests below: the strategies of
    ``TRAINED`` with their variants, the language model's rows and the script's row, then the
    engine benchmark and the machine's facts. One run, not one per test: the benchmark and the
    check's own start-up are then paid once (two runs: 134 s, one: 118 s here). The language
    model trains on the Jargon File's first 64 KiB ($TRAINYARD_JARGON_FILE): each epoch
    evaluates its held-out tail whole at a batch of 16, a round of collectives per window under
    tensor parallel and the pipeline, 328 windows of the whole file's and 13 of these."""
    need(fashion_installed(), "Debian's dataset-fashion-mnist package is not installed")
    tmp_path = tmp_path_factory.mktemp("gpu-check")
    fashion_few_tests_write(tmp_path / "trainyard-gpu-check" / "data" / "FashionMNIST" / "raw")
    text = tmp_path / "jargon-64k.txt"
    text.write_bytes(gzip.decompress(JARGON_DEBIAN.read_bytes())[:65536])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--dry-run", "--out", str(out), "--strategies",
         ",".join([*TRAINED, *LM_LABELS, gpu_check.SCRIPT_ROW])],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "TMPDIR": str(tmp_path), JARGON_ENV: str(text)},
    )  # fmt: skip
    summary = (out / "summary.txt").read_text().splitlines() if out.is_dir() else []
    table = list(itertools.takewhile(bool, summary[3:]))  # the rows, up to the blank line
    return Checked(proc, out, summary, {line.split()[0]: line for line in table})


def assert_all_as_expected(checked: Checked) -> None:
    proc = checked.proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "gpu-check: all as expected"


@pytest.mark.slow  # two strategies trained, their variants refused or skipped, the benchmark
def test_the_device_check_runs_and_reads_the_machine(checked: Checked) -> None:
    """The strategies of ``TRAINED`` (every other row's command is checked by the test above;
    each strategy is trained by its own tests): one new interpreter per row, one batch of
    Fashion-MNIST, then the engine benchmark and the machine's facts, written in the summary's
    format."""
    summary, rows, out = checked.summary, checked.rows, checked.out
    assert summary, checked.proc.stdout[-3000:] + checked.proc.stderr[-3000:]
    assert summary[0].startswith("gpu-check: 0 GPU(s); python ")
    assert summary[2].split() == ["strategy", "ok", "wall", "s", "devices", "result"]
    variants = [label for label, strategy, _ in gpu_check.VARIANTS if strategy in TRAINED]
    # In the script's order: strategies, their variants, the language model's, the script's.
    assert list(rows) == [*TRAINED, *variants, *LM_LABELS, gpu_check.SCRIPT_ROW]
    for strategy in ("single", "ddp"):
        row = rows[strategy]  # the phases checked on every trained row (within 5%: ok)
        assert re.search(r" yes +\d+\.\d +cpu[\w,]* +[\d,]+ img/s, accuracy [01]\.\d{4}, "
                         r"phases off wall by \d+\.\d%$", row), row  # fmt: skip
    # The step's and DDP's options: those needing a GPU refused without one, the rest left to
    # tests/test_step_options.py and tests/test_ddp_options.py.
    assert "refused:" in rows["ddp/fp16"] and "GPUs only" in rows["ddp/fp16"]
    assert "refused:" in rows["ddp/hook-bf16"] and "Gloo" in rows["ddp/hook-bf16"]
    assert " yes " in rows["single/compile"] and "skipped: no GPU" in rows["single/compile"]
    assert " yes " in rows["ddp/powersgd"] and "skipped: no GPU" in rows["ddp/powersgd"]
    # A user's own DDP script through the launcher, 2 Gloo ranks: the observer's two windows
    # (steps 1 and 11 of 12) judged, DDP's all-reduce of the whole model counted each step; the
    # profile asked at the first window recorded at step 12 on both ranks.
    assert re.search(r" yes +\d+\.\d +cpu,cpu +[\d,]+ img/s, 2 windows, phases off wall by "
                     rf"\d+\.\d%, all-reduced {MODEL_BYTES:,} B a step, stalled, rank 1 named, "
                     r"then over \(all_reduce #\d+\), arrivals in every window \(latest rank by "
                     r"[\d,]+ ms at most\), profiled 1 step\(s\) on 2 rank\(s\), cpu$",
                     rows[gpu_check.SCRIPT_ROW]), rows[gpu_check.SCRIPT_ROW]  # fmt: skip
    # The engine benchmark's two workloads, as its defaults run them (tests/test_bench.py runs
    # each alone).
    assert any(line.startswith("imagefolder ratio:") for line in summary)
    assert any(line.startswith("engine ratio:") for line in summary)
    facts = json.loads((out / "facts.json").read_text())
    assert facts["cpu_count"] >= 1 and facts["torch"]["distributed_backends"]["gloo"]
    assert f"device page (NVML, as a worker reads it): {facts['gpu_status']}" in summary
    # Every run's own output is kept for the note.
    logged = (out / "gpu-check.log").read_text()
    assert "===== -m training --strategy ddp" in logged
    assert "===== -m training --strategy script --run-id script-observer" in logged
    assert_all_as_expected(checked)  # every row's verdict, and the benchmark's


def test_the_language_model_rows_are_commands_the_cli_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each language-model row's command, checked by training's own CLI as the other rows' are:
    on the CPU and on 1 to 8 GPUs, the medium size (the smoke size in --dry-run); single on one
    GPU, DDP a rank per GPU, tensor parallel (sequence parallel on) and the pipeline (1F1B) on
    two, both refused with one GPU for want of GPUs."""
    assert [row[0] for row in gpu_check.LM_ROWS] == [
        "lm-single", "lm-ddp", "lm-tp-sp", "lm-pipeline"
    ]  # fmt: skip
    assert set(gpu_check.ROWS) >= {row[0] for row in gpu_check.LM_ROWS}
    two_gpus = {"tensor-parallel", "pipeline"}
    for gpus in PLANNED_GPUS:
        for dry_run in (True, False):
            for label, strategy, flags in gpu_check.LM_ROWS:
                args, expected = gpu_check.lm_args(strategy, gpus)
                argv = gpu_check.lm_argv(strategy, label, args, flags, Path("/data"), dry_run)
                refusal = cli_refusal(argv, gpus=gpus, monkeypatch=monkeypatch)
                where = f"{label} on {gpus} GPU(s): {' '.join(argv)}"
                if gpus == 1 and strategy in two_gpus:
                    assert expected == "refused" and refusal and "GPU" in refusal, where
                    continue
                assert expected == "trains" and refusal is None, f"{where}: {refusal}"
                cfg = parse_args(argv, build_parser())
                assert cfg.model_size == ("smoke" if dry_run else "medium"), where
                ranks = {"single": 1, "ddp": gpus or 2}.get(strategy, 2)
                assert len(cfg.gpus) == (ranks if gpus else 0), where
                assert strategy == "single" or cfg.nproc == ranks, where
                assert cfg.sequence_parallel or strategy != "tensor-parallel", where
                assert cfg.pipeline_schedule == "1f1b" or strategy != "pipeline", where


def _lm_events(source: str, sample: str, bits: float) -> list[dict[str, Any]]:
    """A language-model run's events as the verdict reads them: an untrained first step (8.5
    bits per byte), one epoch whose phases add up to its wall."""
    rank = {f"{name}_seconds": 0.0 for name in gpu_check.PHASE_NAMES}
    rank |= {"forward_seconds": 1.0, "images_per_second": 16.0}
    return [
        {"type": "started", "peak_source": source, "notes": [], "batch_size": 16},
        {"type": "step", "step": 1, "train_loss": 8.5 * math.log(2), "ranks": [rank]},
        {"type": "epoch", "mfu": 0.01, "bits_per_byte": bits, "sample": sample,
         "tokens_per_second": 512.0},
    ]  # fmt: skip


def test_a_language_model_row_fails_on_what_it_checks() -> None:
    """Trained on the CPU: bits per byte below three quarters of the first step's, text written,
    the measured peak. Each thing missing is said, and fails the row."""
    text = "hacker n. [originally, someone who makes furniture with an axe] 1. A person who "
    ok, result = gpu_check.lm_verdict(_lm_events("measured peak (2 cores)", text, 4.4), "single", 0)
    assert ok, result
    assert "bits/byte 8.50 -> 4.4, sample 100% text, phases off wall by 0.0%" in result
    untrained = bytes(range(256)).decode("utf-8", errors="replace")
    ok, result = gpu_check.lm_verdict(_lm_events("measured peak", untrained, 8.4), "single", 0)
    assert not ok
    assert result.endswith("; bits per byte above 75% of the first step's; the sample is not text")
    # On a GPU the peak must be its datasheet's, not a measured one.
    ok, result = gpu_check.lm_verdict(_lm_events("measured peak", text, 4.4), "single", 1)
    assert not ok and result.endswith("; the peak is not the datasheet peak"), result
    ok, result = gpu_check.lm_verdict(_lm_events("measured peak", text, 4.4), "pipeline", 0)
    assert not ok and result.endswith("; not 1F1B in its notes"), result


@pytest.mark.slow  # four short trainings, three of them 2 ranks (in the check run above)
def test_the_language_model_rows_train_on_the_cpu(checked: Checked) -> None:
    """The language model's rows run as in --dry-run on the CPU (the smoke size, 40 steps): each
    brings bits per byte down to text, with its MFU against the measured peak."""
    rows = {label: checked.rows[label] for label in LM_LABELS if label in checked.rows}
    assert list(rows) == LM_LABELS, checked.summary or checked.proc.stderr[-3000:]
    for label, row in rows.items():
        devices = "cpu" if label == "lm-single" else "cpu,cpu"
        assert re.search(
            rf" yes +\d+\.\d +{devices} +[\d,]+ tokens/s, MFU 0\.\d+ of measured peak .*, "
            r"bits/byte \d\.\d\d -> \d\.\d+, sample \d+% text, phases off wall by \d+\.\d%$",
            row,
        ), row
    assert_all_as_expected(checked)


def _full_epoch_events(images: int, batch: int, interval: int, step_s: float) -> list[Any]:
    """One rank's events of a full epoch whose phases add up to its wall time exactly, as the
    meter reports them: a step event at step 1, every ``interval`` steps and at the epoch's end,
    images/s from the window's real images (its last batch short where ``batch`` does not
    divide ``images``)."""
    sizes = [batch] * (images // batch) + ([images % batch] if images % batch else [])
    marks = sorted({1, *range(interval, len(sizes), interval), len(sizes)})
    events: list[Any] = [{"type": "started", "batch_size": batch, "accumulate": 1,
                          "steps_per_epoch": len(sizes)}]  # fmt: skip
    before = 0
    for mark in marks:
        elapsed = (mark - before) * step_s
        rank = {f"{name}_seconds": 0.0 for name in gpu_check.PHASE_NAMES}
        rank["other_seconds"] = elapsed  # hogwild's: no phase marked, all of it other
        rank["images_per_second"] = sum(sizes[before:mark]) / elapsed
        events.append({"type": "step", "step": mark, "ranks": [rank]})
        before = mark
    return events


def test_a_full_epochs_short_last_batch_is_not_a_phases_gap() -> None:
    """What a GPU machine runs (full epochs, not --dry-run): hogwild's 4 processes take 60,000
    images in global batches of 256, so each one's last window is 5 steps of which the last has
    24 images; phases that add up exactly must pass there, and a window whose phases overshoot
    its wall must still fail."""
    events = _full_epoch_events(60000 // 4, 64, 10, step_s=0.01)
    gap = gpu_check.phases_gap(events)
    assert gap is not None and gap <= gpu_check.PHASES_WITHIN, gap
    over = events[2]["ranks"][0]  # a whole window: 10% more phases than its wall
    wall = over["other_seconds"]
    over["forward_seconds"] = 0.1 * wall
    assert gpu_check.phases_gap(events) == pytest.approx((0.1 * wall - 0.001) / wall)


def test_ddp_option_rows_beside_plain_ddp_refused_or_run_by_the_gpus() -> None:
    """DDP's communication hook and optimizer sharding rows, each with plain ddp's arguments plus
    its flags: on the CPU the bf16 hook is refused (Gloo), the others are skipped; on GPUs every
    one trains on NCCL, a rank per GPU."""
    rows = {label: (strategy, flags) for label, strategy, flags in gpu_check.VARIANTS}
    ddp = {
        "ddp/hook-fp16": ["--comm-hook", "fp16"],
        "ddp/powersgd": ["--comm-hook", "powersgd"],
        "ddp/hook-bf16": ["--comm-hook", "bf16"],
        "ddp/shard-optim": ["--shard-optimizer"],
    }
    for label, flags in ddp.items():
        strategy, extra = rows[label]
        assert strategy == "ddp" and list(extra) == flags
        on_cpu = gpu_check.variant_args(strategy, extra, 0)
        assert on_cpu == (["--nproc", "2", *flags], "refused" if "bf16" in flags else "skipped")
        on_gpus = gpu_check.variant_args(strategy, extra, 2)
        assert on_gpus == (["--gpus", "0,1", "--nproc", "2", *flags], "trains")
    # The step's fp16 is refused on the CPU as before, its other options skipped.
    assert gpu_check.variant_args("ddp", ("--precision", "fp16", "--accumulate", "2"), 0)[1] == (
        "refused"
    )
    assert gpu_check.variant_args("single", ("--compile",), 0)[1] == "skipped"


def test_gpu_only_flags_are_the_registrys() -> None:
    """The script imports nothing of ours: its list of values that need GPUs must be the
    registry's (``StrategyOption.gpu_only``), or a new one would be run and fail on the CPU."""
    declared = {
        (option.flag, str(value)) for option in OPTIONS_DECLARED for value, _ in option.gpu_only
    }
    assert set(gpu_check.GPU_ONLY) == declared


def test_prepare_copies_the_data_set_for_a_machine_without_it(tmp_path: Path) -> None:
    need(fashion_installed(), "Debian's dataset-fashion-mnist package is not installed")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "prepare", "--dir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    copied = tmp_path / "fashion-mnist"
    assert sorted(p.name for p in copied.iterdir()) == sorted(
        f"{name}.gz" for name in idx_files.IDX_FILES.values()
    )
    # The language model's text, where training's jargon_file looks in a data folder.
    assert (tmp_path / gpu_check.JARGON_NAME).read_bytes() == JARGON_DEBIAN.read_bytes()


def test_unknown_strategies_are_named() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--strategies", "single,tpu-magic"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "unknown strategies ['tpu-magic']" in proc.stderr


def test_the_script_rows_stall_must_name_rank_1_alone_then_end() -> None:
    behind = "rank 1 never entered all_reduce #5: its last, all_reduce #4, done"
    ranks = [{"rank": 0, "entered": True, "collective": "all_reduce #5",
              "line": "rank 0 waits in all_reduce #5 since 10:00:00 UTC"},
             {"rank": 1, "entered": False, "collective": "all_reduce #4",
              "line": behind}]  # fmt: skip
    stall, over = {"since": 1.0, "ranks": ranks}, {"since": None, "ranks": []}
    said = gpu_check.stall_result([stall, over])
    assert said == "stalled, rank 1 named, then over (all_reduce #5)"
    assert gpu_check.stall_result([stall]) == "1 stalled events, not a stall and its end"
    even = {"since": 1.0, "ranks": [dict(r, line=f"rank {r['rank']} waits") for r in ranks]}
    assert gpu_check.stall_result([even, over]).startswith("a stall whose lines are ")
