"""The launch form's help, per strategy and per model: one home, sent to the page in its JSON
(#form-help), whose script shows the lines of the strategy and model chosen and keeps no copy.

Each line follows from the registry (training/registry.py): who takes a process count, who
shares a batch, who splits the model into stages; a pipeline's stage limit is the model's own
(catalogue_checks.pipeline_stage_limit), said before the form is sent."""

from __future__ import annotations

from typing import Any

from training.registry import REGISTRY, StrategySpec

PROCESSES_EMPTY = "leave empty for one per GPU, or 2 on the CPU"
STAGES_UNKNOWN = (
    "Its stages are counted when it is launched: more processes than it has are refused then."
)


def processes_help(spec: StrategySpec) -> str:
    """The Processes field's line for `spec`."""
    if not spec.processes:
        return f"{spec.label} runs one process: this field is not read."
    if spec.stages:
        return (
            "One stage of the model a process: at most as many processes as the model has "
            f"stages; {PROCESSES_EMPTY}."
        )
    if spec.tensor_ranks == 0:
        return (
            "Ranks that split the model's layers and train on one batch together; "
            f"{PROCESSES_EMPTY}."
        )
    if spec.tensor_ranks > 1:
        return (
            f"An even number, {spec.tensor_ranks * 2} or more: groups of {spec.tensor_ranks} "
            "ranks split the layers, the groups shard the rest."
        )
    return f"Processes, each training on its own batch; {PROCESSES_EMPTY}."


def batch_size_help(spec: StrategySpec) -> str:
    """The Batch size field's line for `spec`: what the global batch is made of."""
    global_batch = "The global batch may not exceed the training set."
    if not spec.processes:
        if spec.gpus_where_present:
            return f"One batch a step, split across the GPUs. {global_batch}"
        return f"Images a step. {global_batch}"
    if spec.tensor_ranks == 0:
        return f"Shared: all ranks train on one batch, so the global batch is this. {global_batch}"
    if spec.tensor_ranks > 1:
        return (
            f"Per group of {spec.tensor_ranks} ranks: the global batch is this x the processes "
            f"/ {spec.tensor_ranks}. {global_batch}"
        )
    return f"Per process: the global batch is this x the processes (x machines). {global_batch}"


def stage_limit_text(model: str, stages: int) -> str:
    """A pipeline's limit, said before launch."""
    return f"{model} splits into at most {stages} stages: at most {stages} processes."


def form_help(*, stage_limits: dict[str, int]) -> dict[str, Any]:
    """The page's #form-help: each strategy's lines, and each model's stage limit known here."""
    return {
        "strategies": {
            spec.name: {
                "processes": processes_help(spec),
                "batch_size": batch_size_help(spec),
                "stages": spec.stages,  # add the chosen model's stage limit to Processes
            }
            for spec in REGISTRY
        },
        "stage_limits": {
            model: stage_limit_text(model, stages) for model, stages in stage_limits.items()
        },
        "stages_unknown": STAGES_UNKNOWN,
    }
