"""``python -m training.bench lm``: what the engine's loop costs a language model, and what each
parallel method gives it (issue 36: the engine keeps at least 0.95 of a bare loop's tokens/s).

Two loops train ``byte-llama`` (``--model-size``, small by default) on the Jargon File in one
process, side by side, with the same initial weights (the run's seed), the same windows (the
engine's seeded draw, ``training.data.text.text_batches``, one global step after the other), the
same learning-rate curve (warm-up, then cosine: ``training.strategies.schedule``), Adam, gradients
clipped at norm 1.0, and the same thread count:

ours  the engine's loop: ``training.engine.epoch_run`` with the single strategy's plan (its step
      with the phase clock, clipping and the scheduled rate), step events every
      ``--log-interval`` steps with their tokens/s, MFU and gradient norm, written (to nowhere).
bare  nanoGPT's ``train.py`` loop, written here over the model's module: the windows stacked
      from the text by slicing (nanoGPT's ``get_batch``), forward, ``F.cross_entropy``,
      backward, ``clip_grad_norm_``, ``torch.optim.Adam``; the loss read every
      ``--log-interval`` steps, as nanoGPT logs it.

The loops alternate (ours, bare, then bare, ours, ...) for ``--rounds`` rounds of ``--steps``
steps each, after ``WARMUP_STEPS`` each, so that the machine's noise falls on both alike; every
round prints each side's tokens/s. Then the medians, each side's MFU (tokens/s x the model's
FLOPs per token over the peak: on the CPU the one measured by ``training.observe.peak``, as a run
measures it) and both models' loss on one held-out batch: the same, give or take float rounding,
where both loops did the same training.

Then every strategy (``--strategies``) trains the same global batch for ``--table-steps`` steps
as ``python -m training`` runs it, at ``--nproc`` processes (fsdp-tp's 2-D mesh at 4: left out
of the default list on a machine with fewer than 4 cores, where its ranks would share them;
name it to run it anyway): tokens/s and MFU (the step events' after the first, which holds the
warm-up), the state each rank holds (parameters, gradients and optimizer state) and its peak
memory (RSS), and the bits per byte of the held-out text after training.

The last line, ``lm ratio``, is the median of the rounds' ratios ours / bare.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training.bench.launch import training_command, training_env
from training.bench.parity import size_text, state_bytes
from training.config import TrainConfig, parse_args
from training.config import build_parser as training_parser
from training.data.datasets import Dataset, text_dataset
from training.data.images import DataRefused
from training.data.text import TextSplit, eval_starts, text_batches
from training.engine import epoch_run, language_figures
from training.epochs import model_build
from training.models.byte_llama.model import ByteLlama, flops_per_token
from training.observe.peak import Peak, run_peak
from training.observe.phases import clock_for
from training.process.allocator import allocator_tune
from training.process.runtime import Runtime, machine_name, start
from training.protocol import EventWriter, parse_event
from training.registry import mesh_shape, strategy_get
from training.strategies import plan_build
from training.strategies.clipping import MAX_NORM
from training.strategies.schedule import lr_schedule, scheduled
from training.text_catalogue import BYTE_LLAMA, BYTE_LLAMA_SIZES, JARGON, model_size_get

SIDES = ("ours", "bare")
WARMUP_STEPS = 2
STRATEGIES = ("single", "ddp", "fsdp", "tensor-parallel", "fsdp-tp", "pipeline")
FSDP_TP_RANKS = 4  # its smallest 2-D mesh: 2 x 2
RUN_TIMEOUT_S = 900


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.bench lm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-size", choices=list(BYTE_LLAMA_SIZES), default="small")
    p.add_argument("--seq-len", type=int, default=None, help="default: the size's")
    p.add_argument("--batch-size", type=int, default=16, help="windows a step, global")
    p.add_argument("--steps", type=int, default=30, help="timed steps per side and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--log-interval", type=int, default=10, help="steps between step events")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--strategies",
        default=None,
        help=f"comma-separated, of {','.join(STRATEGIES)} (default: all; fsdp-tp where the "
        f"machine has {FSDP_TP_RANKS} cores or more); empty: no table",
    )
    p.add_argument("--nproc", type=int, default=2, help="processes of a multi-process strategy")
    p.add_argument("--table-steps", type=int, default=40, help="steps each strategy trains")
    p.add_argument(
        "--data-dir", default=os.environ.get("TRAINYARD_DATA_DIR") or "./var/data", type=Path
    )
    return p


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    strategies = _strategies(args, parser)
    allocator_tune()  # as python -m training does; it applies to both loops alike
    torch.set_num_threads(args.threads)
    cfg = config_make(args)
    rt = start(cfg)
    try:
        data = text_dataset(cfg.dataset, Path(cfg.data_dir), None, _seq_len(cfg))
    except DataRefused as exc:
        print(f"lm benchmark: {exc}", file=sys.stderr)
        return 2
    peak = run_peak(rt, cfg.precision, [machine_name()])
    total = WARMUP_STEPS + args.rounds * args.steps
    ours, bare = EngineLoop(cfg, rt, data, peak, total), BareLoop(cfg, data, total)
    loops: dict[str, EngineLoop | BareLoop] = {"ours": ours, "bare": bare}
    model = bare.model
    print(
        f"lm benchmark: {BYTE_LLAMA} {cfg.model_size} "
        f"({sum(p.numel() for p in model.parameters()):,} parameters, "
        f"{flops_per_token(model, _seq_len(cfg)):,} FLOPs a token), windows of "
        f"{_seq_len(cfg)} bytes of {data.source}, batch {cfg.batch_size}, Adam, "
        f"{args.threads} thread(s), {rt.device}; {args.rounds} round(s) of {args.steps} steps "
        f"a side after {WARMUP_STEPS} warm-up steps, alternating {' / '.join(SIDES)}",
        flush=True,
    )
    assert isinstance(data.train, TextSplit) and isinstance(data.test, TextSplit)
    rates = rounds_run(loops, data.train, args, rt.device)
    ratios = [o / b for o, b in zip(rates["ours"], rates["bare"], strict=True)]
    _sides_print(rates, model, _seq_len(cfg), peak)
    losses = {side: loop.held_out_loss(data.test) for side, loop in loops.items()}
    print(
        f"held-out loss after {total} steps: "
        + ", ".join(f"{side} {loss:.4f}" for side, loss in losses.items())
    )
    print(f"ours / bare per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    failed = _table(strategies, args, cfg) if strategies else False
    print(f"lm ratio: {statistics.median(ratios):.3f}")
    return 1 if failed else 0


def _strategies(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The table's strategies: those given, else all (fsdp-tp where its ranks get a core each)."""
    if args.strategies is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        return [s for s in STRATEGIES if s != "fsdp-tp" or cores >= FSDP_TP_RANKS]
    chosen = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STRATEGIES]
    if unknown:
        parser.error(f"argument --strategies: unknown {unknown}; choose from {STRATEGIES}")
    return chosen


def config_make(args: argparse.Namespace) -> TrainConfig:
    """The run's settings, as ``python -m training`` parses them for the single strategy."""
    argv = [
        "--strategy", "single", "--model", BYTE_LLAMA, "--model-size", args.model_size,
        "--dataset", JARGON, "--data-dir", str(args.data_dir.expanduser().resolve()),
        "--batch-size", str(args.batch_size), "--seed", str(args.seed),
        "--log-interval", str(args.log_interval), "--run-id", "bench-lm",
    ]  # fmt: skip
    if args.seq_len is not None:
        argv += ["--seq-len", str(args.seq_len)]
    return parse_args(argv, training_parser())


def _seq_len(cfg: TrainConfig) -> int:
    assert cfg.seq_len is not None  # a language model's settings always have it
    return cfg.seq_len


class EngineLoop:
    """The engine's loop over one process's plan, continuing from round to round."""

    def __init__(self, cfg: TrainConfig, rt: Runtime, data: Dataset, peak: Peak, total: int):
        clock_for(rt.device)  # as engine.train: every step's phases timed
        built, _ = model_build(cfg)  # seeded with the run's seed
        plan = plan_build(cfg, rt, built.model)
        self.figures = language_figures(cfg, built, plan, peak)
        # The engine's warm-up and cosine over the benchmark's steps (engine._epoch_train).
        step = scheduled(plan.step, plan.optimizer, lr_schedule(cfg.lr, total), first=1)
        self.plan = dataclasses.replace(plan, step=step)
        self.cfg, self.rt, self.data = cfg, rt, data
        self.events = EventWriter(cfg.run_id, stream=open(os.devnull, "w"))  # noqa: SIM115
        self.step = 0

    def __call__(self, batches: list[torch.Tensor]) -> None:
        self.plan.net.train()
        self.step, _ = epoch_run(
            cfg=self.cfg, rt=self.rt, events=self.events, plan=self.plan, data=self.data,
            batches=batches, epoch=1, step=self.step, figures=self.figures,
        )  # fmt: skip

    @property
    def model(self) -> torch.nn.Module:
        return self.plan.model

    def held_out_loss(self, test: TextSplit) -> float:
        return held_out_loss(self.model, test, self.cfg.batch_size, self.rt.device)


class BareLoop:
    """nanoGPT's ``train.py`` loop over ``ByteLlama``, nothing of the engine's but the model,
    the rate's formula and the offsets of the windows."""

    def __init__(self, cfg: TrainConfig, data: Dataset, total: int) -> None:
        assert isinstance(data.train, TextSplit)
        self.seq_len = _seq_len(cfg)
        self.tokens = data.train.tokens
        self.device = torch.device("cpu")
        torch.manual_seed(cfg.seed)  # the engine's model_build seeds the same way
        self.model = ByteLlama(model_size_get(cfg.model_size), self.seq_len).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.schedule = lr_schedule(cfg.lr, total)
        self.log_interval = cfg.log_interval
        self.batch_size = cfg.batch_size
        self.step = 0

    def get_batch(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """nanoGPT's: each window sliced out of the text and stacked."""
        offsets = starts.tolist()
        x = torch.stack([self.tokens[i : i + self.seq_len].long() for i in offsets])
        y = torch.stack([self.tokens[i + 1 : i + 1 + self.seq_len].long() for i in offsets])
        return x.to(self.device), y.to(self.device)

    def __call__(self, batches: list[torch.Tensor]) -> None:
        self.model.train()
        loss = None
        for starts in batches:
            self.step += 1
            for group in self.optimizer.param_groups:
                group["lr"] = self.schedule.at(self.step)
            x, y = self.get_batch(starts)
            logits = self.model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_NORM)
            self.optimizer.step()
            if self.step % self.log_interval == 0:
                loss.item()
        if loss is not None:
            loss.item()  # as the engine reads its loss at a round's last step

    def held_out_loss(self, test: TextSplit) -> float:
        return held_out_loss(self.model, test, self.batch_size, self.device)


@torch.no_grad()
def held_out_loss(
    model: torch.nn.Module, test: TextSplit, batch_size: int, device: torch.device
) -> float:
    """The mean loss on the held-out text's first ``batch_size`` windows."""
    model.eval()
    x, y = test.windows(eval_starts(test, 0, 1)[:batch_size])
    logits = model(x.to(device))
    return float(F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten()))


def rounds_run(
    loops: dict[str, EngineLoop | BareLoop],
    train: TextSplit,
    args: argparse.Namespace,
    device: torch.device,
) -> dict[str, list[float]]:
    """Tokens/s of each side per round, the sides alternating, each round's steps the same
    windows for both (each side training on from where its last round left it)."""
    total = WARMUP_STEPS + args.rounds * args.steps
    batches = text_batches(train, batch_size=args.batch_size, count=1, rank=0, seed=args.seed,
                           first_step=1, steps=total)  # fmt: skip
    for loop in loops.values():  # first-step allocations, lazy initialisation
        loop(batches[:WARMUP_STEPS])
    rates: dict[str, list[float]] = {side: [] for side in loops}
    tokens = args.steps * args.batch_size * train.seq_len
    for round_ in range(args.rounds):
        first = WARMUP_STEPS + round_ * args.steps
        mine = batches[first : first + args.steps]
        for side in SIDES if round_ % 2 == 0 else SIDES[::-1]:
            _sync(device)
            t0 = time.perf_counter()
            loops[side](mine)
            _sync(device)
            rates[side].append(tokens / (time.perf_counter() - t0))
            print(f"round {round_ + 1} {side:4} {rates[side][-1]:10.1f} tokens/s", flush=True)
    return rates


def _sides_print(
    rates: dict[str, list[float]], model: torch.nn.Module, seq_len: int, peak: Peak
) -> None:
    assert isinstance(model, ByteLlama)
    flops = flops_per_token(model, seq_len)
    print(f"{'side':4} {'median tokens/s':>16} {'MFU':>8}  per round")
    for side, per in rates.items():
        median = statistics.median(per)
        rounds = " ".join(f"{r:9.1f}" for r in per)
        print(f"{side:4} {median:16.1f} {peak.mfu(median, flops):8.2%}  {rounds}")
    print(f"MFU against {peak.source}: {peak.flops / 1e9:,.1f} GFLOP/s")


@dataclass
class Row:
    strategy: str
    ranks: int
    batch: int  # a process's (or a group's that shares one) windows a step
    problem: str = ""  # "skipped: ..." or "failed: ...", else empty
    tokens_per_second: float = 0.0
    mfu: float = 0.0
    held: list[int] = field(default_factory=list)  # each rank's state bytes
    peak: int = 0  # the largest rank's peak memory
    bits_per_byte: float | None = None


def _table(strategies: list[str], args: argparse.Namespace, cfg: TrainConfig) -> bool:
    """Each strategy trained as ``python -m training`` runs it, its row printed as it ends;
    whether one failed."""
    print()
    print(
        f"strategies: {args.table_steps} steps of {args.batch_size} windows a step (global), "
        f"at {args.nproc} processes (fsdp-tp {FSDP_TP_RANKS}); tokens/s and MFU of the step "
        "events after the first, all ranks; state (parameters, gradients, optimizer) each rank "
        "holds; peak RSS of the rank holding most; bits per byte after training"
    )
    print(
        f"{'strategy':16} {'ranks':>5} {'batch':>5} {'tokens/s':>9} {'MFU':>7} "
        f"{'peak':>10} {'bits/byte':>9}  state per rank"
    )
    failed = False
    for strategy in strategies:
        row = strategy_row(strategy, args, cfg)
        failed = failed or row.problem.startswith("failed")
        head = f"{row.strategy:16} {row.ranks:>5} {row.batch:>5}"
        if row.problem:
            print(f"{head} {row.problem}", flush=True)
            continue
        bits = f"{row.bits_per_byte:9.4f}" if row.bits_per_byte is not None else f"{'n/a':>9}"
        print(
            f"{head} {row.tokens_per_second:9.1f} {row.mfu:7.2%} {size_text(row.peak):>10} "
            f"{bits}  {' / '.join(size_text(b) for b in row.held)}",
            flush=True,
        )
    return failed


def strategy_row(strategy: str, args: argparse.Namespace, cfg: TrainConfig) -> Row:
    """One strategy's training and what its events said."""
    multi = strategy_get(strategy).processes
    ranks = (FSDP_TP_RANKS if strategy == "fsdp-tp" else args.nproc) if multi else 1
    groups = mesh_shape(strategy, ranks)[0] if multi else 1
    row = Row(strategy, ranks, args.batch_size // groups)
    if args.batch_size % groups:
        row.problem = f"skipped: a batch of {args.batch_size} does not split over {groups} ranks"
        return row
    flags = [
        "--model", BYTE_LLAMA, "--model-size", args.model_size, "--seq-len", str(_seq_len(cfg)),
        "--dataset", JARGON, "--data-dir", cfg.data_dir, "--epochs", "1",
        "--steps-per-epoch", str(args.table_steps), "--batch-size", str(row.batch),
        "--log-interval", str(args.log_interval), "--seed", str(args.seed), "--run-id", "bench-lm",
        *(["--nproc", str(ranks)] if multi else []),
    ]  # fmt: skip
    proc = subprocess.run(
        training_command(strategy, flags), env=training_env(), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    events: list[dict[str, Any]] = [
        dict(e) for e in map(parse_event, proc.stdout.splitlines()) if e is not None
    ]
    steps = [e for e in events if e["type"] == "step"][1:]  # the first holds the warm-up
    epochs = [e for e in events if e["type"] == "epoch"]
    if proc.returncode != 0 or not steps or not epochs:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        row.problem = f"failed: {lines[-1].strip() if lines else f'exit {proc.returncode}'}"
        return row
    row.tokens_per_second = statistics.median(float(e["tokens_per_second"]) for e in steps)
    row.mfu = statistics.median(float(e.get("mfu") or 0.0) for e in steps)
    memory = sorted(epochs[-1].get("memory") or [], key=lambda e: e["rank"])
    row.held = [sum(state_bytes(entry)) for entry in memory]
    row.peak = max((int(entry["peak_bytes"]) for entry in memory), default=0)
    row.bits_per_byte = epochs[-1].get("bits_per_byte")
    return row


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
