"""The run's settings (``TrainConfig``), parsed from the command line (flag names follow
pytorch/examples): the parser, each flag's type and help, and ``parse_args``, which runs the
checks of flags taken together (``training.config_checks``) before it builds the config."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training import config_checks
from training.catalogue import DATASET_NAMES_KNOWN, MODEL_DEFAULT, dataset_plugins
from training.config_checks import ScriptSettings
from training.registry import (
    COUNT,
    MULTIPROCESS_STRATEGIES,
    OPTIONS_DECLARED,
    REGISTRY,
    RESHARD_STRATEGIES,
    SHARED_BATCH_STRATEGIES,
    STRATEGY_NAMES,
    SWITCH,
    SYNC_BATCHNORM_STRATEGIES,
    TENSOR_PARALLEL_STRATEGIES,
    StrategyOption,
    option_strategies,
)
from training.text_catalogue import (
    BYTE_LLAMA,
    BYTE_LLAMA_SIZE_DEFAULT,
    BYTE_LLAMA_SIZES,
    SEQ_LEN_BOUNDS,
)

DATASETS = ("mnist", "fashion-mnist")  # the IDX datasets; dataset_choices() has them all
WORKERS_DEFAULT = 2
OPTIMIZERS = ("adam", "sgd")


# The registry's strategy that runs a user's script (training.scripts), not the engine.
SCRIPT = "script"


@dataclass(frozen=True)
class TrainConfig:
    strategy: str
    nproc: int
    gpus: tuple[int, ...]
    dataset: str
    data_dir: str
    epochs: int
    batch_size: int
    test_batch_size: int
    lr: float
    optimizer: str
    seed: int
    log_interval: int
    dry_run: bool
    run_id: str
    checkpoint_dir: str | None
    resume: str | None
    # The registry's options (OPTIONS_DECLARED) fill these; the defaults are theirs.
    zero_stage: int = 1  # deepspeed
    comm_hook: str = "none"  # ddp: DDP's communication hook
    shard_optimizer: bool = False  # ddp: ZeroRedundancyOptimizer
    accumulate: int = 1  # batches a step (no_sync between)
    compile: bool = False  # torch.compile the model
    precision: str = "fp32"  # fp32, bf16 autocast, fp16 autocast + scaler (GPUs)
    pipeline_schedule: str = "gpipe"  # pipeline: gpipe or 1f1b
    microbatches: int = 4  # pipeline: micro-batches a batch
    keep_checkpoints: int = 2
    keep_requested_checkpoints: int = 5
    steps_per_epoch: int | None = None  # at most this many optimizer steps per epoch
    # Across machines (torchrun's c10d rendezvous): --nproc ranks on each of `nnodes` machines.
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_host: bool = False
    local_addr: str | None = None
    # Stop after the first epoch whose test accuracy reaches this (a study's stop-at-target).
    target_accuracy: float | None = None
    data_path: str | None = None  # --data-path: the image folder of --dataset imagefolder
    workers: int = WORKERS_DEFAULT  # DataLoader workers where the data streams
    # The catalogue's name (training.catalogue); a checkpoint records it, resume checks it.
    model: str = MODEL_DEFAULT
    weights: str | None = None  # a local state-dict file loaded into the model as built
    sync_batchnorm: bool = False  # ddp on GPUs: BatchNorm statistics over all ranks
    reshard_after_forward: bool = True  # fsdp: free gathered parameters after each forward
    phases: bool = True  # time each rank's phases and report them (--no-phases: off)
    script: ScriptSettings | None = None  # --strategy script: the user's code
    # where profiles asked for by SIGUSR2 go (training.observe.profiling)
    profile_dir: str | None = None
    # A language model's (byte-llama): its size preset and window in bytes (None for the
    # others), and whether tensor parallel also splits the norms and residuals by sequence.
    model_size: str | None = None
    seq_len: int | None = None
    sequence_parallel: bool = True

    @property
    def language(self) -> bool:
        """Whether this run trains a language model (on text)."""
        return self.seq_len is not None

    @property
    def step_limit(self) -> int | None:
        """Steps per epoch to stop at, if any: --dry-run is one."""
        return 1 if self.dry_run else self.steps_per_epoch

    def to_dict(self) -> dict[str, Any]:
        # Lists, not tuples: checkpoints are read back with torch.load(weights_only=True).
        d = asdict(self)
        d["gpus"] = list(self.gpus)
        return d


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}, got {value}")
        return value

    return parse


def _learning_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    # "not (0 < value <= 10)" also rejects NaN.
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 10, got {text}")
    return value


def _accuracy(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"a fraction above 0 and at most 1, got {text}")
    return value


def _gpu_ids(text: str) -> tuple[int, ...]:
    if not text.strip():
        return ()
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated GPU ids such as 0,1, got {text!r}"
        ) from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"GPU ids must not be negative, got {text!r}")
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"GPU ids must not repeat, got {text!r}")
    return ids


def _run_id(text: str) -> str:
    if len(text) > 200 or any(not ch.isprintable() for ch in text):
        raise argparse.ArgumentTypeError("must be at most 200 printable characters")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training",
        description="Train a model (the built-in simple-cnn, a torchvision classifier or a "
        "trainyard.models plug-in) on a dataset, or the built-in language model byte-llama on "
        "text (jargon, textfolder), with one of several parallel strategies. "
        "Events go to stdout as JSON lines, logs to stderr.",
        epilog="strategies:\n" + "\n".join(f"  {spec.name:15} {spec.summary}" for spec in REGISTRY),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--strategy", choices=STRATEGY_NAMES, default="single")
    p.add_argument(
        "--nproc",
        type=_int_in(1, 256),
        default=None,
        help=f"processes for {', '.join(MULTIPROCESS_STRATEGIES)} "
        "(default: one per --gpus, else 2)",
    )
    p.add_argument(
        "--gpus",
        type=_gpu_ids,
        default=(),
        help='GPU ids, e.g. "0,1" (default: none, train on the CPU)',
    )
    p.add_argument(
        "--model",
        default=MODEL_DEFAULT,
        metavar="NAME",
        help=f"what to train: {MODEL_DEFAULT} (the default), a torchvision classifier such as "
        "resnet18, or an installed trainyard.models plug-in (python -m training.catalogue "
        "lists them); adapted to the dataset's channels, classes and image size",
    )
    _language_arguments(p)
    p.add_argument(
        "--weights",
        default=None,
        metavar="PATH",
        help="a local state-dict file (or a checkpoint) for the model as built for the dataset; "
        "nothing is fetched from a hub",
    )
    p.add_argument(
        "--sync-batchnorm",
        action="store_true",
        help="convert BatchNorm to SyncBatchNorm, statistics over all ranks "
        f"(--strategy {' or '.join(SYNC_BATCHNORM_STRATEGIES)} on GPUs only)",
    )
    _data_arguments(p)
    p.add_argument(
        "--data-dir",
        default=os.environ.get("TRAINYARD_DATA_DIR") or "./var/data",
        help="dataset folder (default: $TRAINYARD_DATA_DIR or ./var/data)",
    )
    p.add_argument("--epochs", type=_int_in(1, 1000), default=1)
    p.add_argument(
        "--batch-size",
        type=_int_in(1, 8192),
        default=64,
        help="per process, or per tensor-parallel group or pipeline, whose ranks train on one "
        f"batch ({', '.join(SHARED_BATCH_STRATEGIES)}) (default: 64)",
    )
    p.add_argument("--test-batch-size", type=_int_in(1, 8192), default=1000)
    p.add_argument("--lr", type=_learning_rate, default=1e-3)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--seed", type=_int_in(0, 2**31 - 1), default=1)
    p.add_argument(
        "--log-interval",
        type=_int_in(1, 1_000_000),
        default=10,
        help="optimizer steps between step events (default: 10)",
    )
    p.add_argument("--dry-run", action="store_true", help="one batch per epoch, a quick check")
    p.add_argument(
        "--no-phases",
        action="store_false",
        dest="phases",
        help="do not time where each rank's step goes (data, forward, backward, optimizer, "
        "communication) nor report it; DDP keeps its C++ all-reduce",
    )
    p.add_argument(
        "--steps-per-epoch",
        type=_int_in(1, 10**9),
        default=None,
        help="stop each epoch after this many optimizer steps (default: the whole split)",
    )
    p.add_argument(
        "--target-accuracy",
        type=_accuracy,
        default=None,
        metavar="FRACTION",
        help="end the run after the first epoch whose test accuracy reaches this, e.g. 0.97 "
        "(default: train every epoch)",
    )
    p.add_argument("--run-id", type=_run_id, default="", help="echoed in every event")
    p.add_argument("--checkpoint-dir", default=None, help="write epoch-N.pt here each epoch")
    p.add_argument(
        "--profile-dir",
        default=None,
        metavar="DIR",
        help="take profile requests: SIGUSR2 records a torch.profiler trace of the next steps "
        "on every rank, as DIR/request.json asks (see docs/protocol.md)",
    )
    p.add_argument("--resume", default=None, metavar="PATH", help="continue from a checkpoint")
    p.add_argument(
        "--keep-checkpoints",
        type=_int_in(0, 10**6),
        default=2,
        metavar="N",
        help="keep the last N epoch checkpoints, delete older ones (default: 2; 0 keeps all)",
    )
    p.add_argument(
        "--keep-requested-checkpoints",
        type=_int_in(0, 10**6),
        default=5,
        metavar="N",
        help="keep the last N checkpoints written on request (SIGUSR1), delete older ones "
        "(default: 5; 0 keeps all)",
    )
    for option in OPTIONS_DECLARED:
        _option_argument(p, option)
    _reshard_argument(p)
    _multinode_arguments(p)
    _script_arguments(p)
    return p


def _language_arguments(p: argparse.ArgumentParser) -> None:
    sizes = "; ".join(f"{s.name}: {s.help}" for s in BYTE_LLAMA_SIZES.values())
    p.add_argument(
        "--model-size",
        choices=tuple(BYTE_LLAMA_SIZES),
        default=None,
        help=f"a language model's size (--model {BYTE_LLAMA} only; default: "
        f"{BYTE_LLAMA_SIZE_DEFAULT}): {sizes}",
    )
    p.add_argument(
        "--seq-len",
        type=_int_in(*SEQ_LEN_BOUNDS),
        default=None,
        metavar="N",
        help="bytes a language model reads at once, its training windows (default: the size's, "
        + ", ".join(f"{s.seq_len} for {s.name}" for s in BYTE_LLAMA_SIZES.values())
        + "); --batch-size counts these windows",
    )
    p.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tensor parallel also splits a language model's norms and residual stream by "
        f"sequence, torchtitan's plan (--strategy {' or '.join(TENSOR_PARALLEL_STRATEGIES)} "
        "with a language model; default: on)",
    )


def _script_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "your own script",
        "--strategy script runs CODE_DIR/ENTRYPOINT under torchrun (--nproc ranks on each of "
        "--nnodes machines) with the arguments after --; the trainyard library inside it reports",
    )
    g.add_argument("--code-dir", default=None, metavar="DIR", help="the script's folder")
    g.add_argument(
        "--entrypoint", default=None, metavar="FILE", help="its entry point, relative to DIR"
    )
    g.add_argument(
        "--stop-grace",
        type=_int_in(0, 86400),
        default=60,
        metavar="SECONDS",
        help="after SIGTERM (a Stop), how long the ranks have to agree, save and leave before "
        "what is left is ended (default: 60)",
    )


def dataset_choices() -> list[str]:
    """--dataset's choices: the known names (training.catalogue), then installed plug-ins."""
    return [*DATASET_NAMES_KNOWN, *(n for n in dataset_plugins() if n not in DATASET_NAMES_KNOWN)]


def _data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", choices=dataset_choices(), default="mnist")
    p.add_argument(
        "--data-path",
        default=None,
        metavar="DIR",
        help="the image folder for --dataset imagefolder (train/ and val/ or test/ of class "
        "folders, or class folders directly), or the text folder for --dataset textfolder "
        "(.txt files, under train/ and val/ or not; in <data dir>/textfolders or "
        "$TRAINYARD_TEXT_FOLDERS)",
    )
    p.add_argument(
        "-j",
        "--workers",
        type=_int_in(0, 64),
        default=WORKERS_DEFAULT,
        help="DataLoader worker processes where the data streams rather than staying in "
        f"memory (default: {WORKERS_DEFAULT})",
    )


def _option_argument(p: argparse.ArgumentParser, option: StrategyOption) -> None:
    """A strategy's own setting, as the registry declares it; None when not given, so that
    giving it to a strategy that does not read it is refused (``config_checks.options_check``)."""
    takers = option_strategies(option)
    where = f"--strategy {' or '.join(takers)} only" if takers else "no strategy yet"
    default = "" if option.kind == SWITCH else f"; default: {option.default}"
    help_text = f"{option.help} ({where}{default})"
    if option.kind == SWITCH:
        p.add_argument(
            option.flag,
            dest=option.name,
            action="store_const",
            const=True,
            default=None,
            help=help_text,
        )
        return
    if option.kind == COUNT:
        low, high = option.bounds
        p.add_argument(
            option.flag,
            dest=option.name,
            type=_int_in(low, high),
            default=None,
            metavar="K",
            help=help_text,
        )
        return
    p.add_argument(
        option.flag,
        dest=option.name,
        type=type(option.default),
        choices=option.values,
        default=None,
        help=help_text,
    )


def _reshard_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="keep each block's gathered parameters from its forward until its backward: more "
        "memory, one all-gather fewer per block "
        f"(--strategy {' or '.join(RESHARD_STRATEGIES)} only)",
    )


def _multinode_arguments(p: argparse.ArgumentParser) -> None:
    """torchrun's own names for a run over several machines (its elastic quickstart's flags)."""
    g = p.add_argument_group(
        "several machines",
        "start the same command on every machine, with --rdzv-host on the first one "
        "(ddp and deepspeed)",
    )
    g.add_argument(
        "--nnodes",
        type=_int_in(1, 1024),
        default=1,
        help="machines the run spans, --nproc ranks on each (default: 1, torchrun --standalone)",
    )
    g.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="the rendezvous store, on the first machine's address",
    )
    g.add_argument("--rdzv-id", type=_run_id, default=None, help="one id for the whole run")
    g.add_argument(
        "--rdzv-host",
        action="store_true",
        help="this machine hosts the rendezvous store (torchrun's is_host: machines that share "
        "a host name cannot tell by it)",
    )
    g.add_argument(
        "--local-addr",
        default=None,
        metavar="ADDR",
        help="the address other machines reach this one at (Gloo/NCCL use its interface)",
    )


def parse_args(argv: Sequence[str], parser: argparse.ArgumentParser | None = None) -> TrainConfig:
    parser = parser or build_parser()
    argv = list(argv)
    # A script's own arguments follow "--" (argparse would read them as this parser's flags).
    cut = argv.index("--") if "--" in argv else len(argv)
    ns = parser.parse_args(argv[:cut])
    script = config_checks.script_check(ns, parser, args=argv[cut + 1 :], cut=cut < len(argv))
    config_checks.paths_check(ns, parser)
    options: dict[str, Any] = dict(config_checks.options_check(ns, parser))
    config_checks.multinode_check(ns, parser)
    config_checks.reshard_check(ns, parser)
    data_path = config_checks.data_check(ns, parser)
    config_checks.model_check(ns, parser)
    language = config_checks.language_check(ns, parser)
    return TrainConfig(
        strategy=ns.strategy,
        nproc=ns.nproc if ns.nproc is not None else _default_nproc(ns.strategy, ns.gpus),
        gpus=ns.gpus,
        dataset=ns.dataset,
        data_dir=str(Path(ns.data_dir).expanduser().resolve()),
        epochs=ns.epochs,
        batch_size=ns.batch_size,
        test_batch_size=ns.test_batch_size,
        lr=ns.lr,
        optimizer=ns.optimizer,
        seed=ns.seed,
        log_interval=ns.log_interval,
        dry_run=ns.dry_run,
        run_id=ns.run_id,
        checkpoint_dir=(
            str(Path(ns.checkpoint_dir).expanduser().resolve()) if ns.checkpoint_dir else None
        ),
        resume=str(Path(ns.resume).expanduser().resolve()) if ns.resume else None,
        profile_dir=str(Path(ns.profile_dir).expanduser().resolve()) if ns.profile_dir else None,
        keep_checkpoints=ns.keep_checkpoints,
        keep_requested_checkpoints=ns.keep_requested_checkpoints,
        steps_per_epoch=ns.steps_per_epoch,
        target_accuracy=ns.target_accuracy,
        nnodes=ns.nnodes,
        rdzv_endpoint=ns.rdzv_endpoint,
        rdzv_id=ns.rdzv_id,
        rdzv_host=ns.rdzv_host,
        local_addr=ns.local_addr,
        data_path=data_path,
        workers=ns.workers,
        model=ns.model,
        weights=str(Path(ns.weights).expanduser().resolve()) if ns.weights else None,
        sync_batchnorm=ns.sync_batchnorm,
        reshard_after_forward=ns.reshard_after_forward,
        phases=ns.phases,
        script=script,
        model_size=language.model_size,
        seq_len=language.seq_len,
        sequence_parallel=language.sequence_parallel,
        **options,
    )


def _default_nproc(strategy: str, gpus: Sequence[int]) -> int:
    # One process for the one-process strategies, so a checkpoint's config says what ran.
    if strategy not in MULTIPROCESS_STRATEGIES:
        return 1
    return len(gpus) or 2
