"""Every strategy Trainyard knows, in one place: the engine, the CLI and the dashboard read it.

Adding a strategy is one ``StrategySpec`` here plus its module in ``training/strategies/``
(exposing ``plan_build`` for the shared loop, or ``train`` for one that runs its own
processes, as Hogwild does); ``script``, the user's own code, has none: the CLI launches it
before the engine would look for one (``user_script``). The CLI's choices and --help, the
dashboard's model choices (a callable: no migration), form help, list labels, capacity checks
and the page's JSON (``{% page_facts %}``) are derived from this table; nothing else keeps a
copy.

The facts only: the rules a request must keep on any machine (one process per GPU under
torchrun, CPU only, at most / at least so many GPUs), which the CLI and the dashboard both ask,
are ``training.refusals``, which reads this table.

This module imports nothing heavy (no torch): the web process reads it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

DEEPSPEED_REQUIREMENT = "deepspeed==0.19.8"


OptionValue = int | str | bool

# How an option is given: one of named values (``--comm-hook fp16``), a switch
# (``--shard-optimizer``), or a whole number within bounds (``--accumulate 4``).
CHOICE, SWITCH, COUNT = "choice", "switch", "count"


@dataclass(frozen=True)
class StrategyOption:
    """A setting that only the strategies declaring it read (ZeRO's stage, DDP's comm hook): its
    flag, the ``TrainConfig`` attribute and ``Experiment`` field it fills, its values and
    default. A strategy that does not declare it refuses it (the CLI exits 2, the API says 400)."""

    name: str  # the TrainConfig attribute, the Experiment field and the API key
    flag: str  # the CLI's flag
    label: str  # for people: "ZeRO stage"
    help: str  # one line for --help and the launch form
    default: OptionValue  # what a strategy that reads it trains with when none is given
    kind: str = CHOICE  # CHOICE, SWITCH or COUNT
    choices: tuple[tuple[OptionValue, str], ...] = ()  # CHOICE: (value, label), in order
    bounds: tuple[int, int] = (1, 1)  # COUNT: the lowest and highest value
    not_offered: str = ""  # why the values past the choices are refused, said when they are
    # Values that need GPUs (NCCL, CUDA's autocast), with the reason said on the CPU.
    gpu_only: tuple[tuple[OptionValue, str], ...] = ()
    short: str = ""  # a switch's words where space is short (a compare cell); the label else

    @property
    def values(self) -> tuple[OptionValue, ...]:
        """Every value it takes: the choices, (False, True) for a switch, the bounds' range."""
        if self.kind == SWITCH:
            return (False, True)
        if self.kind == COUNT:
            return tuple(range(self.bounds[0], self.bounds[1] + 1))
        return tuple(value for value, _ in self.choices)

    def invalid_text(self) -> str:
        """ "the ZeRO stage is 1 or 2 (stage 3 is not offered)"."""
        if self.kind == COUNT:
            low, high = self.bounds
            return f"the {self.label} is a whole number from {low} to {high}"
        if self.kind == SWITCH:
            return f"{self.label} is true or false"
        values = " or ".join(str(v) for v in self.values)
        why = f" ({self.not_offered})" if self.not_offered else ""
        return f"the {self.label} is {values}{why}"

    def cli_args(self, value: OptionValue) -> list[str]:
        """The command-line words that ask for ``value``: a switch is its flag or nothing."""
        if self.kind == SWITCH:
            return [self.flag] if value else []
        return [self.flag, str(value)]

    def gpu_reason(self, value: OptionValue) -> str | None:
        """Why ``value`` needs GPUs, or None when it runs on the CPU too."""
        return dict(self.gpu_only).get(value)


@dataclass(frozen=True)
class Requirement:
    """An optional package a strategy imports, which the CLI checks before it starts."""

    module: str  # what ``import`` finds: "deepspeed"
    label: str  # for people: "DeepSpeed"
    install: str  # the command that installs it, with the extra that names it
    # Set for the ranks to "cuda" or "cpu" (with or without GPUs), where the package picks
    # its accelerator when imported and cannot tell by itself (DeepSpeed on a CPU machine).
    accelerator_env: str = ""


ZERO_STAGE = StrategyOption(
    name="zero_stage",
    flag="--zero-stage",
    label="ZeRO stage",
    help="DeepSpeed ZeRO stage: 1 partitions optimizer state, 2 also gradients",
    default=1,
    choices=(
        (1, "ZeRO-1: optimizer state sharded"),
        (2, "ZeRO-2: optimizer state and gradients sharded"),
    ),
    not_offered="stage 3 is not offered",
)
# Issue 18's options. Each is attached to the strategies that read it (``StrategySpec.options``);
# declared here once, so the CLI, the form, the API and studies all take the same values.
# PowerSGD's matrix approximation rank and the steps of plain all-reduce before it starts
# (training/strategies/ddp.py says why these).
POWERSGD_RANK = 2
POWERSGD_START = 10
COMM_HOOK = StrategyOption(
    name="comm_hook",
    flag="--comm-hook",
    label="communication hook",
    help="DDP's gradient communication hook: fp16 (bf16 on NCCL) all-reduces each bucket in half "
    f"precision, half the bytes; powersgd sends rank-{POWERSGD_RANK} factors of each gradient "
    f"matrix after {POWERSGD_START} plain steps, the error fed back; none all-reduces "
    "full-precision gradients",
    default="none",
    choices=(
        ("none", "none: full-precision all-reduce"),
        ("fp16", "fp16: buckets compressed to float16"),
        ("powersgd", "PowerSGD: low-rank gradient compression"),
        ("bf16", "bf16: buckets compressed to bfloat16 (NCCL only)"),
    ),
    gpu_only=(
        (
            "bf16",
            "the bf16 compression hook fails on Gloo, the CPU's backend (\"Invalid scalar "
            'type", pytorch#111131): it needs NCCL, on GPUs (--gpus)',
        ),
    ),
)
SHARD_OPTIMIZER = StrategyOption(
    name="shard_optimizer",
    flag="--shard-optimizer",
    label="shard the optimizer",
    help="ZeroRedundancyOptimizer (PyTorch's own ZeRO-1): each rank keeps and steps the "
    "optimizer state of its share of the parameters (whole ones: about 1/N where none "
    "dominates), then broadcasts them",
    default=False,
    kind=SWITCH,
    short="ZeRO-1 optimizer",
)
ACCUMULATE = StrategyOption(
    name="accumulate",
    flag="--accumulate",
    label="gradient accumulation steps",
    help="batches whose gradients add up before each optimizer step (K batches, one step; "
    "DDP synchronises only on the last, no_sync between)",
    default=1,
    kind=COUNT,
    bounds=(1, 1024),
)
COMPILE = StrategyOption(
    name="compile",
    flag="--compile",
    label="torch.compile",
    help="compile the model with torch.compile first; the compile time is reported apart from "
    "the training time",
    default=False,
    kind=SWITCH,
)
PRECISION = StrategyOption(
    name="precision",
    flag="--precision",
    label="precision",
    help="fp32, bf16 autocast, or fp16 autocast with a gradient scaler (GPUs only)",
    default="fp32",
    choices=(
        ("fp32", "fp32: full precision"),
        ("bf16", "bf16: bfloat16 autocast"),
        ("fp16", "fp16: float16 autocast with a gradient scaler (GPUs)"),
    ),
    gpu_only=(("fp16", "fp16 autocast with a gradient scaler runs on GPUs only (--gpus)"),),
)
PIPELINE_SCHEDULE = StrategyOption(
    name="pipeline_schedule",
    flag="--pipeline-schedule",
    label="pipeline schedule",
    help="GPipe runs every micro-batch's forward, then every backward; 1F1B interleaves them "
    "(less activation memory); interleaved-1f1b gives each rank 2 stages, looped (a smaller "
    "bubble); zero-bubble (ZB-V) gives each rank 2 stages in a V and splits each backward into "
    "its input's and its weights' parts to fill the bubble; the last two need a model cut into "
    "twice as many stages as ranks (a language model's layers)",
    default="gpipe",
    choices=(
        ("gpipe", "GPipe"),
        ("1f1b", "1F1B"),
        ("interleaved-1f1b", "Interleaved 1F1B: 2 stages a rank"),
        ("zero-bubble", "Zero bubble (ZB-V): 2 stages a rank"),
    ),
)
# The schedules that run more stages than ranks, and how many a rank holds.
STAGES_PER_RANK = {"interleaved-1f1b": 2, "zero-bubble": 2}
MICROBATCHES = StrategyOption(
    name="microbatches",
    flag="--microbatches",
    label="micro-batches",
    help="micro-batches each batch is cut into for the pipeline (more: less idle time, smaller "
    "pieces)",
    default=4,
    kind=COUNT,
    bounds=(1, 256),
)
# What one optimizer step does (training.strategies.stepping): the strategies whose step is
# training.strategies.common.step_default read them.
STEP_OPTIONS: tuple[StrategyOption, ...] = (ACCUMULATE, COMPILE, PRECISION)
# Every declared option, attached to a strategy or not yet: the CLI takes each flag (refused
# where no strategy reads it) and TrainConfig has each attribute.
OPTIONS_DECLARED: tuple[StrategyOption, ...] = (
    ZERO_STAGE,
    COMM_HOOK,
    SHARD_OPTIMIZER,
    ACCUMULATE,
    COMPILE,
    PRECISION,
    PIPELINE_SCHEDULE,
    MICROBATCHES,
)
DEEPSPEED = Requirement(
    module="deepspeed",
    label="DeepSpeed",
    install=f"DS_BUILD_OPS=0 pip install --no-build-isolation '{DEEPSPEED_REQUIREMENT}' "
    "(the 'deepspeed' extra of this package)",
    accelerator_env="DS_ACCELERATOR",
)


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
    cpu_reason: str = ""  # with cpu_only: why, said when GPUs are refused ("it ...")
    max_gpus_reason: str = ""  # with max_gpus: why, said when more GPUs are refused
    # On a machine with GPUs it needs --gpus: without them it would run as a silent
    # pass-through (nn.DataParallel with no device ids).
    gpus_where_present: bool = False
    options: tuple[StrategyOption, ...] = ()  # the settings only it reads
    requires: Requirement | None = None  # an optional package it imports
    # Ranks that split the model's layers between them and so train on one batch together
    # (tensor parallel, pipeline): 1 none, 0 all of them, N groups of N (fsdp-tp's tensor
    # dimension).
    tensor_ranks: int = 1
    # Splits the model into stages, one a rank, by its declared split (pipeline), not by a
    # tensor-parallel plan.
    stages: bool = False
    # Why it cannot record a profile on request ("it ..."); "" where it can: every strategy of
    # the shared loop (training.observe.profiling hooks its steps).
    profile_refusal: str = ""
    # Runs the user's own script, not the engine: it reads no model, dataset, epochs, batch
    # size, learning rate or optimizer (the script has its own), and no module of
    # training.strategies exists for it.
    user_script: bool = False
    # Trains the language model (byte-llama) on text: by the model's own plan where it splits
    # it (torchtitan's per-block tensor-parallel plan, FSDP2 per block, pipeline by layer).
    language_models: bool = False


REGISTRY: tuple[StrategySpec, ...] = (
    StrategySpec(
        name="single",
        label="Single device",
        short="Single",
        summary="One process on one device: the baseline every other strategy is compared with.",
        help="One process on one device: a GPU when you pick one, else the CPU.",
        module="single",
        max_gpus=1,
        max_gpus_reason="a single-device run uses one GPU",
        options=STEP_OPTIONS,
        language_models=True,
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
        gpus_where_present=True,
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
        options=(*STEP_OPTIONS, COMM_HOOK, SHARD_OPTIMIZER),
        language_models=True,
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
        summary="The model split in two stages (its top-level parts, balanced by parameters) "
        "on two devices, activations moved between them.",
        help="The model cut in two stages on different devices (0, 1 or 2 GPUs, the rest on "
        "the CPU), activations passed between them: for models too big for one device.",
        module="model_parallel",
        max_gpus=2,
        max_gpus_reason="model parallel splits the model into 2 stages: give 0, 1 or 2 GPU ids "
        "(none: both stages on the CPU; one: a stage on it and the other on the CPU)",
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
        cpu_reason="keeps the model in shared host memory, which its processes update "
        "without locks",
        profile_refusal="it runs its own processes and loop, which the profiler's step hooks "
        "do not reach",
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
        options=(ZERO_STAGE,),
        requires=DEEPSPEED,
        language_models=True,
    ),
    StrategySpec(
        name="fsdp",
        label="FSDP2 (fully_shard)",
        short="FSDP",
        summary="FSDP2 (fully_shard) under torchrun: parameters, gradients and optimizer state "
        "sharded over ranks, each block gathered for its forward and backward.",
        help="FSDP2: like DDP, one process per rank, but each rank holds only its shard of the "
        "parameters, gradients and optimizer state (1/N of each), gathering a block's "
        "parameters when it runs; Gloo on CPU, NCCL on GPUs.",
        module="fsdp",
        processes=True,
        torchrun=True,
        nodes=True,
        # Not --compile: per-block compile of FSDP2's sharded blocks is not offered yet.
        options=(ACCUMULATE, PRECISION),
        language_models=True,
    ),
    StrategySpec(
        name="pipeline",
        label="Pipeline (GPipe, 1F1B)",
        short="Pipeline",
        summary="Pipeline parallel (torch.distributed.pipelining) under torchrun: the model's "
        "declared stages one a rank, each batch run through them in --microbatches pieces "
        "(--pipeline-schedule gpipe or 1f1b).",
        help="Pipeline parallel: the model cut into one stage per rank (its declared split, as "
        "model parallel's), each batch cut into micro-batches that flow through the stages, "
        "GPipe or 1F1B; each rank holds only its stage. Gloo on CPU, NCCL on GPUs.",
        module="pipeline",
        processes=True,
        torchrun=True,
        options=(PIPELINE_SCHEDULE, MICROBATCHES),
        tensor_ranks=0,
        stages=True,
        language_models=True,
    ),
    StrategySpec(
        name="tensor-parallel",
        label="Tensor parallel",
        short="TP",
        summary="Tensor parallel (parallelize_module) under torchrun: the model's declared linear "
        "layers split column- then row-wise over the ranks, which train on one batch together.",
        help="Tensor parallel: the linear layers the model's plan names are split over the ranks "
        "(each holds 1/N of their weights, one all-reduce per pair of layers), the rest "
        "replicated; every rank sees the same batch. Gloo on CPU, NCCL on GPUs.",
        module="tensor_parallel",
        processes=True,
        torchrun=True,
        tensor_ranks=0,
        language_models=True,
    ),
    StrategySpec(
        name="fsdp-tp",
        label="FSDP2 + tensor parallel (2-D)",
        short="FSDP+TP",
        summary="2-D parallelism under torchrun: tensor parallel within pairs of ranks, FSDP2 "
        "across the pairs (a dp x tp mesh, tp = 2); --nproc even, 4 or more.",
        help="FSDP2 and tensor parallel on a 2-D mesh: each pair of ranks splits the model's "
        "declared linear layers (one batch a pair), and the pairs shard everything with FSDP2, "
        "each on its own data; an even number of processes, 4 or more.",
        module="fsdp_tp",
        processes=True,
        torchrun=True,
        tensor_ranks=2,
        language_models=True,
    ),
    StrategySpec(
        name="script",
        label="Your own script",
        short="Script",
        summary="Your own training script (--entrypoint in --code-dir) under torchrun, --nproc "
        "processes, observed through the trainyard library it imports.",
        help="Your own training script: its entry point runs under torchrun, one process per "
        "rank, and reports its figures, stops and checkpoints through the trainyard library.",
        module="script",  # none: the CLI diverts a script run before the engine
        processes=True,
        torchrun=True,
        nodes=True,
        # Profiles on request: its ranks' observer records them (training/scripts/profiles.py).
        user_script=True,
    ),
)

STRATEGIES: dict[str, StrategySpec] = {spec.name: spec for spec in REGISTRY}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)
TORCHRUN_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.torchrun)
MULTIPROCESS_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.processes)
# The strategies the engine trains (a model of the catalogue on a dataset): all but the user's
# own script.
ENGINE_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if not s.user_script)
# --sync-batchnorm: the strategies that convert BatchNorm to SyncBatchNorm, and why not on the CPU
# (checked with torch 2.14.1 and 2 Gloo ranks: its forward raises "SyncBatchNorm expected input
# tensor to be on GPU or XPU or privateuseone").
SYNC_BATCHNORM_STRATEGIES = ("ddp",)
SYNC_BATCHNORM_CPU_REASON = (
    "needs GPUs (--gpus): torch's SyncBatchNorm does not run on CPU tensors, so Gloo ranks on "
    "the CPU cannot sync BatchNorm statistics"
)

# --no-reshard-after-forward: FSDP2 keeps each block's gathered parameters from its forward
# until its backward (more memory, one all-gather fewer per block); a flag, not a StrategyOption
# (those take numbered choices).
RESHARD_STRATEGIES = ("fsdp",)

# The strategies that split layers by the model's declared tensor-parallel plan: they take only
# models that declare one (training.models.build.model_tensor_plan, a worker's
# models_tensor_parallel).
TENSOR_PARALLEL_STRATEGIES: tuple[str, ...] = tuple(
    s.name for s in REGISTRY if s.tensor_ranks != 1 and not s.stages
)
# The strategies whose ranks (or groups of them) train on one batch together: --batch-size is
# per group, not per rank.
SHARED_BATCH_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.tensor_ranks != 1)

# The strategies that train a language model (training.refusals refuses the others).
LANGUAGE_STRATEGIES: tuple[str, ...] = tuple(s.name for s in REGISTRY if s.language_models)

# Every strategy's own settings, once each, in the order the registry declares them.
STRATEGY_OPTIONS: tuple[StrategyOption, ...] = tuple(
    dict.fromkeys(option for spec in REGISTRY for option in spec.options)
)


def pipeline_stages_count(schedule: str | None, processes: int) -> int:
    """Stages a pipeline of ``processes`` ranks runs under ``schedule``."""
    return processes * STAGES_PER_RANK.get(schedule or str(PIPELINE_SCHEDULE.default), 1)


def option_value_text(option: StrategyOption, value: OptionValue) -> str:
    """A value in few words, for a label beside the strategy's: "PowerSGD" (a choice's label
    before its colon), "ZeRO-1 optimizer" (a switch that is on), "8 micro-batches"."""
    if option.kind == SWITCH:
        words = option.short or option.label
        return words if value else f"no {words}"
    if option.kind == COUNT:
        return f"{value} {option.short or option.label}"
    label = dict(option.choices).get(value, str(value))
    return label.split(":", 1)[0]


def option_strategies(option: StrategyOption) -> tuple[str, ...]:
    """The names of the strategies that read ``option``."""
    return tuple(spec.name for spec in REGISTRY if option in spec.options)


def strategy_get(name: str) -> StrategySpec:
    """The spec of ``name``; a ValueError naming the known strategies otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown strategy {name!r}: use one of {', '.join(STRATEGY_NAMES)}"
        ) from None


def mesh_shape(name: str, processes: int) -> tuple[int, int]:
    """(data-parallel, tensor-parallel) sizes of ``name`` over ``processes`` ranks. The ranks of
    one tensor-parallel group train on one batch together, so --batch-size is per group and a
    step's global batch is --batch-size x the data-parallel size: (N, 1) for the strategies that
    split data only, (1, N) for tensor-parallel, (N/2, 2) for fsdp-tp."""
    tensor = strategy_get(name).tensor_ranks or processes
    return max(processes // tensor, 1), tensor


def global_batch_size(name: str, *, batch_size: int, accumulate: int = 1, world: int) -> int:
    """Images per optimizer step over the whole run: --batch-size x --accumulate x the groups
    that take a batch of their own (mesh_shape's data-parallel size over ``world`` ranks; one
    for the strategies of one process, DataParallel splitting its one batch). One home: the
    dashboard's figure of a queued run is the one the engine reports once it starts."""
    groups = mesh_shape(name, world)[0] if strategy_get(name).processes else 1
    return batch_size * max(1, accumulate) * groups


def global_batch_words(name: str, *, batch_size: int, accumulate: int = 1, world: int) -> str:
    """How global_batch_size makes it, in words: "4,096 a process x 2 processes", "64 shared by
    its 2 ranks", "one batch of 64"."""
    spec = strategy_get(name)
    groups = mesh_shape(name, world)[0] if spec.processes else 1
    if groups > 1 and spec.tensor_ranks == 1:
        words = f"{batch_size:,} a process x {groups} processes"
    elif groups > 1:
        words = f"{batch_size:,} a group of {spec.tensor_ranks} ranks x {groups} groups"
    elif spec.processes and world > 1:
        words = f"{batch_size:,} shared by its {world} ranks"
    else:
        words = f"one batch of {batch_size:,}"
    return words + (f" x {accumulate} batches accumulated" if accumulate > 1 else "")
