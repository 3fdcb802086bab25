"""Every strategy Trainyard knows, in one place: the engine, the CLI and the dashboard read it.

Adding a strategy is one ``StrategySpec`` here plus its module in ``training/strategies/``
(exposing ``plan_build`` for the shared loop, or ``train`` for one that runs its own
processes, as Hogwild does). The dashboard's model choices, form help, list labels and the
page's JSON are derived from this table; nothing else keeps a copy.

This module imports nothing heavy (no torch): the web process reads it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategySpec:
    name: str  # the value on the command line, in the database and in the API
    label: str  # the full name shown to people
    short: str  # the name in narrow columns (the run list)
    summary: str  # one line for ``python -m training --help``
    help: str  # one or two sentences for the launch form
    module: str  # ``training.strategies.<module>``
    processes: bool = False  # starts several processes and takes --nproc / ``processes``
    torchrun: bool = False  # its ranks are started by torchrun (one process per GPU with GPUs)
    cpu_only: bool = False  # trains on the CPU whatever GPUs the machine has
    min_gpus: int = 0  # fewer GPUs than this cannot run it
    max_gpus: int | None = None  # more GPUs than this make no sense for it (None: no bound)
    nodes: bool = False  # can span several machines (torchrun's rendezvous)


REGISTRY: tuple[StrategySpec, ...] = (
    StrategySpec(
        name="single",
        label="Single device",
        short="Single",
        summary="One process on one device: the baseline every other strategy is compared with.",
        help="One process on one device: a GPU when you pick one, else the CPU.",
        module="single",
        max_gpus=1,
    ),
    StrategySpec(
        name="dp",
        label="DataParallel",
        short="DP",
        summary="nn.DataParallel: one process splits each batch over --gpus, gradients summed "
        "on the first (without GPUs a pass-through).",
        help="DataParallel: one process splits each batch across the chosen GPUs and gathers "
        "the results on the first; without GPUs it runs as a plain single CPU process.",
        module="dp",
    ),
    StrategySpec(
        name="ddp",
        label="DistributedDataParallel",
        short="DDP",
        summary="DistributedDataParallel: --nproc processes under torchrun, gradients "
        "all-reduced every step (NCCL on GPUs, Gloo on the CPU).",
        help="DistributedDataParallel: one process per rank (torchrun), each on its own shard "
        "of the data, gradients averaged by all-reduce (NCCL on GPUs, Gloo on CPU).",
        module="ddp",
        processes=True,
        torchrun=True,
        nodes=True,
    ),
    StrategySpec(
        name="dp-primitives",
        label="DataParallel primitives",
        short="DP prim.",
        summary="DataParallel written out with replicate, scatter, parallel_apply and gather; "
        "needs 2 or more GPUs.",
        help="DataParallel built by hand from replicate, scatter, parallel_apply and gather: "
        "shows what nn.DataParallel does each step; needs 2 or more GPUs on one machine.",
        module="dp_primitives",
        min_gpus=2,
    ),
    StrategySpec(
        name="model-parallel",
        label="Model parallel",
        short="MP",
        summary="The model split in two stages (convolutions, classifier) on two devices, "
        "activations moved between them.",
        help="The model cut in two stages on different devices (0, 1 or 2 GPUs, the rest on "
        "the CPU), activations passed between them: for models too big for one device.",
        module="model_parallel",
        max_gpus=2,
    ),
    StrategySpec(
        name="hogwild",
        label="Hogwild",
        short="Hogwild",
        summary="--nproc processes update one model in shared memory, asynchronously and "
        "without locks, each on its own shard of the data.",
        help="Hogwild: CPU processes train one model held in shared memory, each on its own "
        "shard, updating it without locks; cheap parallelism on many cores.",
        module="hogwild",
        processes=True,
        cpu_only=True,
    ),
    StrategySpec(
        name="deepspeed",
        label="DeepSpeed ZeRO",
        short="DeepSpeed",
        summary="DeepSpeed ZeRO stage 1 or 2 (--zero-stage) under torchrun: optimizer state "
        "(and gradients) partitioned over ranks.",
        help="DeepSpeed ZeRO under torchrun: like DDP, but optimizer state (stage 1) and "
        "gradients (stage 2) are split across ranks to save memory; Gloo on CPU, NCCL on GPUs.",
        module="deepspeed_zero",
        processes=True,
        torchrun=True,
        nodes=True,
    ),
)

STRATEGIES: dict[str, StrategySpec] = {spec.name: spec for spec in REGISTRY}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)
TORCHRUN_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.torchrun)
MULTIPROCESS_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.processes)


def strategy_get(name: str) -> StrategySpec:
    """The spec of ``name``; a ValueError naming the known strategies otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}: use one of {', '.join(STRATEGY_NAMES)}"
        ) from None
