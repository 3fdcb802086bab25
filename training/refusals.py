"""The rules a request must keep on any machine, and the words that refuse it.

One process per GPU under torchrun, CPU only, at most / at least so many GPUs, a 2-D mesh's
shape, a pipeline's stages and micro-batches, an option the strategy does not read: the CLI
(``training.cli``, ``training.config_checks``) and the dashboard (its launch form, the API,
capacity checks, studies) both ask these functions, and each says a ``Refusal`` in its own words
(flags or fields), so they refuse the same combinations. The facts they read are the registry's
(``training.registry``); the machine's own limits (cores, which GPUs exist) are the caller's.

Like the registry, this module imports nothing heavy (no torch): the web process reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from training.catalogue import ModelEntry, model_language, model_splittable, plugin_source
from training.registry import (
    LANGUAGE_STRATEGIES,
    MICROBATCHES,
    OPTIONS_DECLARED,
    PIPELINE_SCHEDULE,
    REGISTRY,
    STAGES_PER_RANK,
    OptionValue,
    StrategyOption,
    StrategySpec,
    option_strategies,
    pipeline_stages_count,
    strategy_get,
)
from training.text_catalogue import (
    BYTE_VOCAB,
    LANGUAGE_MODELS,
    TEXT_DATASETS,
    model_size_get,
)

RULE_PER_GPU = "per_gpu"  # torchrun strategies with GPUs: one process per GPU
RULE_CPU_ONLY = "cpu_only"  # no GPU ids at all
RULE_MAX_GPUS = "max_gpus"
RULE_MIN_GPUS = "min_gpus"  # callers that know the machine say more (which one has enough)
RULE_MESH = "mesh"  # a 2-D mesh (fsdp-tp): the ranks must factor into its two dimensions
RULE_PIPELINE = "pipeline"  # stages, micro-batches and the batch must fit together
RULE_LANGUAGE = "language"  # a language model: text, its strategies, widths its split divides
NUMBER_WORDS = ("no", "one", "two", "three", "four")


@dataclass(frozen=True)
class Refusal:
    """One rule of a strategy that a request breaks, said to both audiences."""

    rule: str  # one of the RULE_* names
    field: str  # where the fix is: "processes" (--nproc) or "gpus" (--gpus)
    message: str  # in the dashboard's words: the launch form and the API
    cli_message: str  # in the command line's words, its flags


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else (words or word + 's')}"


def gpu_ids_text(ids: Sequence[int]) -> str:
    """ "no GPU", "GPU 0", "GPUs 0, 1"."""
    if not ids:
        return "no GPU"
    return f"GPU{'s' if len(ids) > 1 else ''} {', '.join(str(i) for i in ids)}"


def _number_word(count: int) -> str:
    return NUMBER_WORDS[count] if 0 <= count < len(NUMBER_WORDS) else str(count)


def strategy_refusals(name: str, *, processes: int, gpus: Sequence[int]) -> list[Refusal]:
    """What ``name`` refuses in this request on any machine; empty when it may run.

    ``gpus`` empty means the CPU. The machine's own limits (cores, which GPUs exist) are the
    caller's to check: the CLI asks torch, the dashboard its workers' reports.
    """
    spec = strategy_get(name)
    refusals: list[Refusal] = []
    if spec.torchrun and gpus and processes != len(gpus):
        refusals.append(_refusal_per_gpu(spec, processes=processes, gpus=gpus))
    if spec.cpu_only and gpus:
        refusals.append(_refusal_cpu_only(spec, gpus=gpus))
    if spec.max_gpus is not None and len(gpus) > spec.max_gpus:
        refusals.append(_refusal_max_gpus(spec, spec.max_gpus, gpus=gpus))
    if len(gpus) < spec.min_gpus:
        refusals.append(_refusal_min_gpus(spec, gpus=gpus))
    if not _mesh_fits(spec, processes):
        refusals.append(_refusal_mesh(spec, processes=processes))
    return refusals


def _mesh_fits(spec: StrategySpec, processes: int) -> bool:
    """Whether ``processes`` ranks lay out on the strategy's 2-D mesh, where it has one: groups
    of ``tensor_ranks``, and 2 groups or more (a 1 x N mesh is tensor-parallel's)."""
    tensor = spec.tensor_ranks
    return tensor <= 1 or (processes % tensor == 0 and processes >= 2 * tensor)


def option_refusals(
    name: str, *, values: Mapping[str, OptionValue | None], gpus: Sequence[int]
) -> list[tuple[StrategyOption, str]]:
    """What ``name`` refuses among the options given (``values``: name -> value, None or absent
    for not given), in words both audiences share: an option the strategy does not read, a value
    that needs GPUs on the CPU. The CLI prefixes its flag, the dashboard names its field."""
    spec = strategy_get(name)
    refusals = []
    for option in OPTIONS_DECLARED:
        value = values.get(option.name)
        if value is None or (option not in spec.options and value == option.default):
            continue
        if option not in spec.options:
            takers = option_strategies(option)
            where = f"--strategy {' or '.join(takers)} only" if takers else "no strategy yet"
            refusals.append((option, f"applies to {where}, not {name}"))
        elif not gpus and (reason := option.gpu_reason(value)):
            refusals.append((option, f"{value}: {reason}"))
    return refusals


def pipeline_refusals(
    name: str,
    *,
    processes: int,
    batch_size: int,
    microbatches: int | None,
    schedule: str | None,
    stages: int | None = None,
    language: bool = False,
) -> list[Refusal]:
    """What a pipeline (a strategy that splits the model into stages) refuses in this request:
    fewer than two stages, more stages than the model has parts (``stages``, where the caller
    knows it; a ``language`` model's are its layers), a batch that does not cut into equal
    micro-batches, and fewer micro-batches than stages with 1F1B (torch's Schedule1F1B requires
    as many) or with a language model (a stage would idle for good). Empty elsewhere."""
    spec = strategy_get(name)
    if not spec.stages:
        return []
    m = int(MICROBATCHES.default if microbatches is None else microbatches)
    schedule = schedule or str(PIPELINE_SCHEDULE.default)
    count = pipeline_stages_count(schedule, processes)
    refusals = []
    if processes < 2:
        refusals.append(
            Refusal(
                RULE_PIPELINE, "processes",
                f"a pipeline needs 2 stages or more, one a process (got {processes})",
                f"argument --nproc: {name} runs one stage per rank and needs 2 or more "
                f"(got --nproc {processes})",
            )
        )  # fmt: skip
    elif stages is not None and count > stages and language:
        per = count // processes
        each = "one stage a process" if per == 1 else f"{per} stages a process ({schedule})"
        refusals.append(
            Refusal(
                RULE_PIPELINE, "processes",
                f"the pipeline cuts the model by layer, {each}, and it has {stages} layers: "
                f"give {stages // per} processes or fewer (got {processes})",
                f"argument --nproc: {name} runs {each.replace('process', 'rank')}, cut by "
                f"layer, and the model has {stages} layers; got --nproc {processes} ({count} "
                "stages: more stages than layers)",
            )
        )  # fmt: skip
    elif stages is not None and count > processes and count > stages:
        refusals.append(
            Refusal(
                RULE_PIPELINE, "pipeline_schedule",
                f"{schedule} runs {count // processes} stages a process, and the model splits "
                f"into at most {stages} (its parts that hold parameters; a language model's "
                "layers split finer)",
                f"argument --pipeline-schedule: {schedule} runs {count // processes} stages a "
                f"rank, {count} in all, and the model splits into at most {stages} (its parts "
                "that hold parameters)",
            )
        )  # fmt: skip
    elif stages is not None and processes > stages:
        refusals.append(
            Refusal(
                RULE_PIPELINE, "processes",
                f"the model splits into at most {stages} stages (its parts that hold "
                f"parameters), one a process: give {stages} processes or fewer (got {processes})",
                f"argument --nproc: {name} runs one stage per rank, and the model splits into at "
                f"most {stages} stages (its parts that hold parameters); got --nproc {processes}",
            )
        )  # fmt: skip
    if batch_size % m:
        refusals.append(
            Refusal(
                RULE_PIPELINE, "microbatches",
                f"the batch size {batch_size} does not cut into {m} equal micro-batches: give "
                "a number of micro-batches that divides it",
                f"argument --microbatches: --batch-size {batch_size} does not cut into {m} equal "
                "micro-batches; give a number that divides it",
            )
        )  # fmt: skip
    if language and m < processes:
        refusals.append(
            Refusal(
                RULE_PIPELINE, "microbatches",
                f"a pipeline needs at least as many micro-batches as stages: {m} for "
                f"{processes}",
                f"argument --microbatches: {m} micro-batches are fewer than the {processes} "
                "stages (--nproc); give at least as many",
            )
        )  # fmt: skip
    elif schedule != "gpipe" and m < processes:
        refusals.append(
            Refusal(
                RULE_PIPELINE, "microbatches",
                f"{_schedule_words(schedule)} needs at least as many micro-batches as stages: "
                f"{m} for {processes}",
                f"argument --microbatches: --pipeline-schedule {schedule} needs at least as many "
                f"micro-batches as stages (--nproc): got {m} for {processes}",
            )
        )  # fmt: skip
    rounds = _rounds_refusal(schedule, processes=processes, microbatches=m)
    return refusals + ([rounds] if rounds is not None else [])


def _rounds_refusal(schedule: str, *, processes: int, microbatches: int) -> Refusal | None:
    """torch's schedules of several stages a rank (ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble) run the micro-batches in max(1, M // ranks) rounds of equal size and
    raise, on every rank after the start, where the rounds do not divide M (5 on 2 ranks)."""
    if schedule not in STAGES_PER_RANK or processes < 1:
        return None
    rounds = max(1, microbatches // processes)
    if microbatches % rounds == 0:
        return None
    fix = f"give a multiple of {processes}, or fewer than {2 * processes}"
    return Refusal(
        RULE_PIPELINE, "microbatches",
        f"{_schedule_words(schedule)} runs its micro-batches in equal rounds: {microbatches} "
        f"micro-batches make {rounds} rounds over {processes} processes, which do not divide "
        f"them; {fix}",
        f"argument --microbatches: --pipeline-schedule {schedule} runs its micro-batches in "
        f"equal rounds: {microbatches} micro-batches make {rounds} rounds over {processes} "
        f"ranks, which do not divide them; {fix}",
    )  # fmt: skip


def language_refusals(
    name: str,
    *,
    model: str,
    dataset: str,
    processes: int,
    model_size: str | None = None,
    seq_len: int | None = None,
    sequence_parallel: bool | None = None,
    language: bool | None = None,
    splittable: bool | None = None,
) -> list[Refusal]:
    """What a request pairing a language model (byte-llama or a plug-in's) or text refuses: a
    language model on images or a classifier on text, a strategy that does not train language
    models, and widths the tensor-parallel degree does not divide (heads, the 256-byte
    vocabulary, the SwiGLU width; with sequence parallel the window); for a plug-in, byte-llama's
    size and sequence parallel, and a pipeline where it declares no parts. The pipeline's are
    ``pipeline_refusals``'. Empty for a classifier on images.

    ``language`` (the model is a language model) and ``splittable`` (a plug-in declares its
    parts): where the caller knows them better than this machine's installed plug-ins (the
    dashboard, from its workers' reports); None asks the installed catalogue."""
    if language is None:
        language = model_language(model)
    text = dataset in TEXT_DATASETS
    if not language and not text:
        return []
    if language != text:
        return [_refusal_pairing(model, dataset, language=language)]
    spec = strategy_get(name)
    if not spec.language_models:
        return [
            Refusal(
                RULE_LANGUAGE, "strategy",
                f"{spec.label} does not train language models yet; use "
                f"{', '.join(LANGUAGE_STRATEGIES)}",
                f"argument --strategy: {name} does not train language models ({model}) yet; "
                f"use {', '.join(LANGUAGE_STRATEGIES)}",
            )
        ]  # fmt: skip
    if model not in LANGUAGE_MODELS:  # a plug-in: its own widths, its build says them
        found = _refusals_plugin_options(
            model, model_size=model_size, sequence_parallel=sequence_parallel
        )
        if spec.stages and not found:
            if splittable is None:
                splittable = model_splittable(ModelEntry(model, plugin_source(model)))
            if not splittable:
                found.append(_refusal_plugin_pipeline(spec, model))
        return found
    if spec.stages or spec.tensor_ranks == 1:
        return []
    return _tensor_widths_refusals(spec, model, processes, model_size, seq_len, sequence_parallel)


def _refusals_plugin_options(
    model: str, *, model_size: str | None, sequence_parallel: bool | None
) -> list[Refusal]:
    """byte-llama's size preset and sequence parallel, given for a plug-in language model: it
    has its own size and its own tensor-parallel plan (which splits by sequence or not)."""
    refusals = []
    for field, flag, value in (
        ("model_size", "--model-size", model_size),
        ("sequence_parallel", "--sequence-parallel", sequence_parallel),
    ):
        if value not in (None, ""):
            owner = f"{' or '.join(LANGUAGE_MODELS)}'s only"
            why = f"the plug-in language model {model} has its own size and tensor-parallel plan"
            refusals.append(
                Refusal(RULE_LANGUAGE, field, f"{owner}; {why}", f"argument {flag}: {owner}; {why}")
            )
    return refusals


def _refusal_plugin_pipeline(spec: StrategySpec, model: str) -> Refusal:
    # The pipeline cuts byte-llama by layer, a plug-in where its build declares its parts.
    declare = "build.stages(model) -> [(name, module), ...], its parts in order"
    return Refusal(
        RULE_LANGUAGE, "strategy",
        f"{spec.label} cuts {', '.join(LANGUAGE_MODELS)} by layer; the plug-in language model "
        f"{model} declares no cut ({declare})",
        f"argument --strategy: {spec.name} cuts {', '.join(LANGUAGE_MODELS)} by layer; the "
        f"plug-in language model {model} declares no cut ({declare})",
    )  # fmt: skip


def _refusal_pairing(model: str, dataset: str, *, language: bool) -> Refusal:
    texts = " or ".join(TEXT_DATASETS)
    if language:
        return Refusal(
            RULE_LANGUAGE, "dataset",
            f"{model} is a language model: it trains on text ({texts}), not on {dataset}",
            f"argument --dataset: {model} is a language model and trains on text ({texts}), "
            f"not on {dataset}",
        )  # fmt: skip
    return Refusal(
        RULE_LANGUAGE, "model",
        f"{dataset} is text: it trains a language model ({', '.join(LANGUAGE_MODELS)}), not "
        f"{model}",
        f"argument --model: --dataset {dataset} is text, which trains a language model "
        f"(--model {' or '.join(LANGUAGE_MODELS)}), not {model}",
    )  # fmt: skip


def _tensor_widths_refusals(
    spec: StrategySpec,
    model: str,
    processes: int,
    model_size: str | None,
    seq_len: int | None,
    sequence_parallel: bool | None,
) -> list[Refusal]:
    """The widths a tensor-parallel degree must divide: each rank takes whole heads, an equal
    share of the vocabulary's logits (loss_parallel) and of the SwiGLU width; with sequence
    parallel an equal share of each window's positions."""
    size = model_size_get(model_size)
    degree = spec.tensor_ranks or processes
    where = f"{degree} tensor-parallel ranks"
    widths = [
        ("number of heads", size.n_heads, "processes", "--nproc"),
        ("vocabulary (the byte values)", BYTE_VOCAB, "processes", "--nproc"),
        ("SwiGLU width", size.hidden_dim, "processes", "--nproc"),
    ]
    if sequence_parallel is not False:  # each rank takes an equal share of a window's bytes
        widths.append(("window (--seq-len)", seq_len or size.seq_len, "seq_len", "--seq-len"))
    refusals = []
    for what, width, field, flag in widths:
        if width % degree == 0:
            continue
        refusals.append(
            Refusal(
                RULE_LANGUAGE, field,
                f"{model} ({size.name}) cannot be split over {where}: its {what}, {width}, is "
                f"not a multiple of {degree}",
                f"argument {flag}: {spec.name} splits {model} ({size.name}) over {where}, and "
                f"its {what}, {width}, is not a multiple of {degree}",
            )
        )  # fmt: skip
    return refusals


def _schedule_words(schedule: str) -> str:
    """ "1F1B", "Interleaved 1F1B", "Zero bubble (ZB-V)": the choice's label before its colon."""
    return str(dict(PIPELINE_SCHEDULE.choices).get(schedule, schedule)).split(":", 1)[0]


def _ids(gpus: Sequence[int]) -> str:
    return ",".join(str(i) for i in gpus)


def _refusal_per_gpu(spec: StrategySpec, *, processes: int, gpus: Sequence[int]) -> Refusal:
    return Refusal(
        RULE_PER_GPU,
        "processes",
        f"{spec.short} runs one process per GPU: {plural(processes, 'process', 'processes')} "
        f"for {plural(len(gpus), 'GPU')} ({gpu_ids_text(gpus)})",
        f"argument --nproc: {spec.name} runs one process per GPU, so --nproc must equal the "
        f"number of --gpus (got --nproc {processes} and {len(gpus)} GPU(s): {_ids(gpus)})",
    )


def _refusal_cpu_only(spec: StrategySpec, *, gpus: Sequence[int]) -> Refusal:
    reason = spec.cpu_reason or "needs no GPU"
    alternatives = ", ".join(s.name for s in REGISTRY if not s.cpu_only and not s.user_script)
    return Refusal(
        RULE_CPU_ONLY,
        "gpus",
        f"{spec.short} trains on the CPU: it {reason}; leave the GPU ids empty "
        f"(got {gpu_ids_text(gpus)})",
        f"argument --gpus: {spec.name} {reason}, and trains on the CPU; leave out --gpus "
        f"(for GPUs use --strategy {alternatives})",
    )


def _refusal_max_gpus(spec: StrategySpec, most: int, *, gpus: Sequence[int]) -> Refusal:
    reason = spec.max_gpus_reason or f"{spec.label} uses at most {plural(most, 'GPU')}"
    most_text = f"{_number_word(most)} GPU{'' if most == 1 else 's'}"
    return Refusal(
        RULE_MAX_GPUS,
        "gpus",
        f"{reason}, not {len(gpus)} ({gpu_ids_text(gpus)})",
        f"argument --gpus: {reason}; give at most {most_text} (got {len(gpus)}: {_ids(gpus)})",
    )


def _refusal_mesh(spec: StrategySpec, *, processes: int) -> Refusal:
    tensor = spec.tensor_ranks
    shape = f"data-parallel groups of {tensor} tensor-parallel ranks"
    return Refusal(
        RULE_MESH,
        "processes",
        f"{spec.short} lays its processes on a 2-D mesh ({shape}): give a multiple of {tensor}, "
        f"{2 * tensor} or more, so that both dimensions have 2 (got {processes})",
        f"argument --nproc: {spec.name} lays its ranks on a 2-D mesh ({shape}), so --nproc "
        f"must be a multiple of {tensor} and at least {2 * tensor}, both dimensions 2 or more "
        f"(got --nproc {processes}); for tensor parallel alone use --strategy tensor-parallel",
    )


def _refusal_min_gpus(spec: StrategySpec, *, gpus: Sequence[int]) -> Refusal:
    asked = f"got {gpu_ids_text(gpus)}" if gpus else "no GPU ids were given"
    return Refusal(
        RULE_MIN_GPUS,
        "gpus",
        f"{spec.label} need at least {spec.min_gpus} GPUs on one machine ({asked})",
        f"--strategy {spec.name} needs --gpus with {_number_word(spec.min_gpus)} or more ids",
    )
