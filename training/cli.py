"""``python -m training``: parse, validate, launch torchrun for ddp, run, report the outcome."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, NoReturn

from training.config import TrainConfig, build_parser, parse_args, under_torchrun
from training.observe.progress import PROGRESS_ENV, records_folder_make
from training.process.torchrun import (
    socket_interfaces_set,
    torchrun_rank_output,
    torchrun_rendezvous,
)
from training.protocol import EventWriter, log_line_format
from training.refusals import RULE_MIN_GPUS, pipeline_refusals, strategy_refusals
from training.registry import DEEPSPEED, REGISTRY, TORCHRUN_STRATEGIES, strategy_get
from training.text_catalogue import LANGUAGE_MODELS, model_size_get

log = logging.getLogger("training")

EXIT_FAILED = 1
EXIT_SIGTERM = 143  # 128 + SIGTERM, what a shell reports for a process killed by it


def main(argv: Sequence[str] | None = None, *, events_stream: IO[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        # torchrun passes "--" through or drops it depending on the Python version.
        argv = argv[1:]
    # CUDA numbers GPUs fastest first, nvidia-smi and NVML by PCI bus; --gpus means the latter.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    parser = build_parser()
    cfg = parse_args(argv, parser)
    cfg = validate_config(cfg, parser)
    # Early, so that a SIGTERM at any point from here on runs the finally blocks below.
    _exit_on_sigterm()
    # Before `started` names this process as the one to ask: SIGUSR1 would otherwise kill it.
    from training.process.run_requests import requests_install

    requests_install()

    if cfg.script is not None:
        # A user's script: this process stays its launcher (the engine is not imported).
        from training.scripts.launch import script_launch

        return script_launch(cfg, events_stream=events_stream or _claim_stdout())
    if cfg.strategy in TORCHRUN_STRATEGIES and not under_torchrun():
        exec_torchrun(cfg, argv)

    # torch is imported only now: argument errors and the torchrun launcher do not wait for it.
    from training import engine
    from training.process import runtime
    from training.process.allocator import allocator_tune

    allocator_tune()

    rank = int(os.environ.get("RANK", "0")) if cfg.strategy in TORCHRUN_STRATEGIES else 0
    logging.basicConfig(
        stream=sys.stderr,
        level=log_level(rank=rank, environ=os.environ),
        # Readable at a shell, and marked so that a watcher tells these lines from other output.
        format=log_line_format(rank=rank),
    )
    if events_stream is None:
        events_stream = _claim_stdout()
    events = EventWriter(cfg.run_id, enabled=rank == 0, stream=events_stream)

    rt = None
    # Once `finished` is out (evaluated, checkpointed), an end in the teardown is not a failed
    # run: the exit status says it, no `failed` event takes the results back.
    trained = False
    try:
        rt = runtime.start(cfg)
        engine.train(cfg, rt, events)
        trained = True
        runtime.finish(rt)
        return 0
    except SystemExit as exc:
        reason = "stopped by SIGTERM" if exc.code == EXIT_SIGTERM else f"exited ({exc.code})"
        _report_failure(events, reason, "", trained=trained)
        raise
    except KeyboardInterrupt:
        _report_failure(events, "interrupted", "", trained=trained)
        return 130
    except Exception as exc:
        log.exception("training failed")
        error = f"{type(exc).__name__}: {exc}"
        _report_failure(events, error, traceback.format_exc(), trained=trained)
        return EXIT_FAILED
    finally:
        runtime.stop(rt)
        _progress_folder_remove()


def log_level(*, rank: int, environ: Mapping[str, str]) -> str:
    """This rank's logging level. A reader of the events (the dashboard) sets
    TRAINYARD_LOG_LEVEL=WARNING: rank 0's info lines repeat its events. The other ranks write no
    events, so their info lines are their own news: TRAINYARD_RANKS_LOG_LEVEL, where set, is
    theirs."""
    level = environ.get("TRAINYARD_LOG_LEVEL", "INFO")
    if rank > 0:
        level = environ.get("TRAINYARD_RANKS_LOG_LEVEL", level)
    return level.upper()


def validate_config(cfg: TrainConfig, parser: argparse.ArgumentParser) -> TrainConfig:
    """Refusals before training starts; each ends in parser.error (exit status 2).

    The strategy's own rules come from training.refusals (the dashboard refuses the same), the
    machine's from torch. A GPU minimum waits for the machine's count: "this machine has one
    GPU" is the more useful answer.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.strategy not in TORCHRUN_STRATEGIES and world > 1:
        parser.error(
            f"--strategy {cfg.strategy} runs one process, but this one was started as one of "
            f"{world} (WORLD_SIZE={world}); use --strategy "
            f"{' or '.join(TORCHRUN_STRATEGIES)}"
        )
    refusals = strategy_refusals(cfg.strategy, processes=cfg.nproc, gpus=cfg.gpus)
    too_few = [r for r in refusals if r.rule == RULE_MIN_GPUS]
    for refusal in refusals:
        if refusal not in too_few:
            parser.error(refusal.cli_message)
    spec = strategy_get(cfg.strategy)
    if spec.stages:
        _validate_pipeline(cfg, parser)
    if spec.requires is not None and not package_available(spec.requires.module):
        parser.error(
            f"--strategy {spec.name} needs the optional {spec.requires.label} package, which "
            f"is not installed here; install it with: {spec.requires.install}"
        )
    # Under torchrun the launcher has checked the ids and renumbered them already.
    min_gpus = spec.min_gpus
    if under_torchrun() or not (cfg.gpus or min_gpus or spec.gpus_where_present):
        return cfg
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _validate_gpu_count(cfg, parser, count=count, min_gpus=min_gpus)
    if too_few:  # on a machine that has enough GPUs
        example = ",".join(map(str, range(min(count, 2))))
        parser.error(
            f"{too_few[0].cli_message} (this machine has {count} GPUs, e.g. --gpus {example})"
        )
    return cfg


def _validate_pipeline(cfg: TrainConfig, parser: argparse.ArgumentParser) -> None:
    """The pipeline's stages, micro-batches and batch. The model's stage count is known by
    building it on the meta device (torch imported for it); the launcher asks, its ranks not."""
    stages = None
    if cfg.language and cfg.model in LANGUAGE_MODELS:  # by layer: the size says how many
        stages = model_size_get(cfg.model_size).n_layers
    elif not under_torchrun() and cfg.nproc >= 2:
        from training.models.build import model_stage_limit

        stages = model_stage_limit(cfg.model, seq_len=cfg.seq_len)
    for refusal in pipeline_refusals(
        cfg.strategy, processes=cfg.nproc, batch_size=cfg.batch_size,
        microbatches=cfg.microbatches, schedule=cfg.pipeline_schedule, stages=stages,
        language=cfg.language,
    ):  # fmt: skip
        parser.error(refusal.cli_message)


# What a machine without (enough) GPUs can run instead, from the registry.
CPU_STRATEGIES = tuple(spec.name for spec in REGISTRY if not spec.min_gpus)


def _names_or(names: Sequence[str]) -> str:
    """ "a", "a or b", "a, b or c"."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


def _validate_gpu_count(
    cfg: TrainConfig, parser: argparse.ArgumentParser, *, count: int, min_gpus: int
) -> None:
    """Refusals that depend on how many GPUs this machine has (``count``)."""
    if count < min_gpus:
        parser.error(
            f"--strategy {cfg.strategy} needs {min_gpus} or more GPUs; this machine has "
            f"{count} GPU(s)"
            + ("" if count else ", CUDA is not available")
            + f"; on the CPU use --strategy {_names_or(CPU_STRATEGIES)}"
        )
    if cfg.gpus and count == 0:
        parser.error(
            f"argument --gpus: GPU {','.join(map(str, cfg.gpus))} requested, but CUDA is not "
            "available on this machine (no GPU found); leave --gpus out to train on the CPU"
        )
    missing = [g for g in cfg.gpus if g >= count]
    if missing:
        parser.error(
            f"argument --gpus: no GPU {','.join(map(str, missing))} here; this machine has "
            f"{count} GPU(s), ids 0 to {count - 1}"
        )
    # DataParallel without GPUs is a silent pass-through: on a machine with GPUs, a mistake.
    if strategy_get(cfg.strategy).gpus_where_present and not cfg.gpus and count > 0:
        parser.error(
            f"--strategy {cfg.strategy} needs --gpus on this machine ({count} GPU(s), e.g. --gpus "
            f"{','.join(map(str, range(min(count, 2))))}); to train on the CPU use --strategy "
            "single"
        )


def package_available(module: str) -> bool:
    """Whether ``import <module>`` would find the package (without importing it: seconds)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None
        return False


def deepspeed_available() -> bool:
    return package_available(DEEPSPEED.module)


def exec_torchrun(cfg: TrainConfig, argv: Sequence[str]) -> NoReturn:
    """Become ``torchrun`` running this same command once per rank (on this machine).

    exec, not a child process: the PID the caller holds (to signal or wait on) is the launcher
    itself. One machine: --standalone picks a free port, so runs started together never collide;
    several: the c10d rendezvous of ``torchrun_rendezvous``.
    """
    env = dict(os.environ)
    if cfg.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, cfg.gpus))
    requires = strategy_get(cfg.strategy).requires
    if requires is not None and requires.accelerator_env:
        # DeepSpeed picks its accelerator when imported; without GPUs it must be told "cpu".
        env.setdefault(requires.accelerator_env, "cuda" if cfg.gpus else "cpu")
    # The ranks start with `-m training` from the caller's working directory, which need not
    # be the one this package was found from.
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    if cfg.nnodes > 1:
        socket_interfaces_set(env, cfg.local_addr)
    # Each rank's progress record for rank 0's stall watch (training.observe.rank_watch); the
    # first rank removes the folder when it ends (_progress_folder_remove).
    env[PROGRESS_ENV] = records_folder_make()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun_rendezvous(cfg),
        f"--nproc-per-node={cfg.nproc}",
        # Each rank's stderr (its prints too: _claim_stdout) with its rank. Its files go in the
        # records' folder, which the machine's first rank removes at the end: torchrun's tail
        # has them open by then, and nothing is left behind in /tmp.
        *torchrun_rank_output(streams=2),
        f"--log-dir={Path(env[PROGRESS_ENV]) / 'output'}",
        "-m",
        "training",
        # Without "--" torchrun's own parser reads our flags too: it takes abbreviations, so
        # --nproc is an "ambiguous option" to it and others could be silently swallowed.
        "--",
        *argv,
    ]
    print("trainyard: exec " + " ".join(cmd), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # exec resets a handled signal to its default, which for SIGUSR1 is to die; an ignored one
    # stays ignored, in torchrun and in the ranks until they install their handler. So a
    # checkpoint request sent to every process of the job (as batch schedulers do) is taken by
    # rank 0 and harms none of the others.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.execve(sys.executable, cmd, env)


def _progress_folder_remove() -> None:
    """The machine's first rank removes the records' folder exec_torchrun made, however the
    run ended (the other ranks' records stay mapped in them, unlinked)."""
    folder = os.environ.get(PROGRESS_ENV)
    if folder and os.environ.get("LOCAL_RANK") == "0":
        shutil.rmtree(folder, ignore_errors=True)


def _claim_stdout() -> IO[str]:
    """Keep the real stdout for events only; anything else printed goes to stderr.

    Done at the file-descriptor level so that prints from libraries, and from C code, cannot
    put a stray line into the event stream.
    """
    sys.stdout.flush()
    events_fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(events_fd, "w", buffering=1, encoding="utf-8")


def _exit_on_sigterm() -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        # A second SIGTERM must not interrupt the cleanup the first one started.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.warning("SIGTERM received; stopping")
        raise SystemExit(EXIT_SIGTERM)

    signal.signal(signal.SIGTERM, handler)


def _report_failure(events: EventWriter, error: str, tb: str, *, trained: bool) -> None:
    if trained:
        log.warning("after the training finished: %s", error)
        return
    try:
        events.emit("failed", error=error, traceback=tb)
    except (OSError, ValueError):
        # The reader may be gone (broken pipe); the exit status still tells.
        log.warning("could not write the failed event")
