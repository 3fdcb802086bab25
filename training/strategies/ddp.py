"""``ddp``: ``DistributedDataParallel``, one torchrun rank per process (NCCL on GPUs, Gloo on
the CPU); gradients are averaged over ranks during backward.

BatchNorm is the one layer whose forward differs from a single process's at the same global
batch: each rank normalises with its own shard's batch statistics, and the running ones are
rank 0's (DDP broadcasts its buffers every step). The run says so; on GPUs ``--sync-batchnorm``
converts it to ``SyncBatchNorm``, statistics over all ranks (the CLI refuses it on the CPU,
where torch's does not run).

Two options change what goes over the wire and what each rank keeps:

``--comm-hook`` registers one of torch's DDP communication hooks, which replace the all-reduce
of each gradient bucket: ``fp16``/``bf16`` cast the bucket to half precision for the all-reduce
(half the bytes; ``bf16`` on NCCL only, its hook fails on Gloo, pytorch#111131), ``powersgd``
sends each gradient matrix as two low-rank factors (``POWERSGD_RANK``) after
``POWERSGD_START`` steps of plain all-reduce, the compression error fed back into the next step.
PowerSGD's error and warm-start factors are not checkpointed: a resumed run starts them afresh.

``--shard-optimizer`` wraps the run's optimizer (Adam, or SGD with momentum, as
``optimizer_make`` builds it) in ``ZeroRedundancyOptimizer`` (ZeRO-1): each rank keeps and steps
the state of its own share of the parameters, then broadcasts them, so every rank still holds
the whole model. Shares are whole parameters, largest first, so a model with one dominant tensor
cannot split evenly (the run's notes say each rank's share). Checkpoints consolidate the state
on rank 0 into a torch optimizer's ``state_dict``: plain DDP, single and ``--shard-optimizer``
resume each other's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn
from torch.distributed import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.futures import Future
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from training.checkpoint import holds_torch_optimizer, optimizer_state_load
from training.config import TrainConfig
from training.observe.collectives import hook_timed
from training.process.runtime import Runtime, all_gather
from training.registry import POWERSGD_RANK, POWERSGD_START
from training.strategies.clipping import GradClip
from training.strategies.common import Plan, optimizer_make, plan_simple, step_default
from training.strategies.stepping import StepOptions

if TYPE_CHECKING:
    # Imported where --shard-optimizer uses it: it imports DTensor and FSDP (0.3 s a rank).
    from torch.distributed.optim import ZeroRedundancyOptimizer

S = TypeVar("S")  # a communication hook's state
Hook = Callable[[S, GradBucket], Future[torch.Tensor]]

# PowerSGD's settings (training.registry: --help and the form say them). Rank 2: each m x n
# gradient matrix goes as (m + n) x 2 numbers (SimpleCNN: about 60x fewer than whole gradients),
# which trained within 2 points of DDP's accuracy in tests/test_ddp_options.py. Ten plain steps
# first: torch's default, 1,000, would cover most of a short run, and its first two steps must be
# plain (DDP rebuilds its buckets after the first).
# The hooks that cast each bucket to a 16-bit type for its all-reduce, and that type's name.
CAST_HOOKS = {
    "fp16": (default_hooks.fp16_compress_hook, "float16"),
    "bf16": (default_hooks.bf16_compress_hook, "bfloat16"),
}


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    notes = batchnorm_notes(cfg, model, rt.world_size)
    if cfg.sync_batchnorm:
        # Same buffers and parameters, so the state dict (checkpoints) keeps its keys.
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(rt.device)
    if rt.device.type == "cuda":
        net = DistributedDataParallel(model, device_ids=[rt.device.index])
    else:
        net = DistributedDataParallel(model)
        notes.insert(
            0,
            f"DistributedDataParallel ran {rt.world_size} CPU process(es) over gloo, each with "
            f"{torch.get_num_threads()} thread(s) and a batch of {cfg.batch_size}, so one step "
            f"covers {cfg.batch_size * rt.world_size} images.",
        )
    if cfg.comm_hook != "none":
        notes.append(comm_hook_register(cfg.comm_hook, net, model, rt.device))
    elif cfg.phases:
        # The default all-reduce as a Python hook: the phases see it (training.observe.collectives).
        net.register_comm_hook(None, hook_timed(default_hooks.allreduce_hook))
    if cfg.shard_optimizer:
        return plan_sharded(cfg, rt, model, net, notes)
    return plan_simple(cfg, model, net, rt.device, notes=notes)


def batchnorm_notes(cfg: TrainConfig, model: nn.Module, world: int) -> list[str]:
    """What the run's BatchNorm layers do over ``world`` ranks, if it has any."""
    count = sum(isinstance(m, _BatchNorm) for m in model.modules())
    if not count:
        return []
    if cfg.sync_batchnorm:
        return [
            f"{cfg.model}: its {count} BatchNorm layer(s) became SyncBatchNorm (--sync-batchnorm): "
            f"batch statistics are taken over all {world} ranks, as one process would."
        ]
    return [
        f"{cfg.model} has {count} BatchNorm layer(s): each of the {world} ranks normalises with "
        f"its own shard's batch statistics (batches of {cfg.batch_size}, not "
        f"{cfg.batch_size * world}), so a step is not the one a single process takes on the "
        "global batch; the running statistics are rank 0's (DDP broadcasts its buffers every "
        "step). --sync-batchnorm (GPUs) takes the statistics over all ranks."
    ]


# --- --comm-hook ---------------------------------------------------------------------------


def comm_hook_register(
    name: str, net: DistributedDataParallel, model: nn.Module, device: torch.device
) -> str:
    """Register the hook ``name`` on ``net``; returns the note that says what it sends."""
    whole = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=POWERSGD_START,
        )
        low_rank: Hook[powerSGD_hook.PowerSGDState] = powerSGD_hook.powerSGD_hook
        if device.type != "cuda":
            low_rank = bucket_by_bucket(low_rank)
        net.register_comm_hook(state, hook_timed(low_rank))
        return _powersgd_note(model, ordered=device.type != "cuda")
    hook, dtype = CAST_HOOKS[name]
    net.register_comm_hook(None, hook_timed(hook))
    return (
        f"Communication hook {name} ({hook.__name__}): each gradient bucket is cast to {dtype} "
        f"for its all-reduce and back after, so {name} compression halves the bytes each "
        f"all-reduce sends ({whole // 2:,} instead of {whole:,} a step); the averaged gradients "
        f"keep {dtype}'s precision."
    )


def bucket_by_bucket(hook: Hook[S]) -> Hook[S]:
    """``hook`` with each bucket's communication done before the next bucket's hook starts.

    PowerSGD's hook all-reduces its P and Q factors from the callbacks of the all-reduce before,
    and Gloo runs those callbacks on its own threads whenever that one completes: with two
    buckets or more, the ranks then start their all-reduces in different orders, and Gloo
    aborts ("Received data size doesn't match expected size ... collective mismatch"; here 2 runs
    of 5 with SimpleCNN's two buckets). NCCL marks its futures done as each all-reduce is queued
    (CUDA events carry the wait), so their callbacks run at once, in order: GPUs keep the hook
    as it is, and its overlap with backward."""

    # wraps: DDP reads the hook's signature (its annotations must be the real types, not the
    # strings this module's are) and logs its name: both the wrapped hook's.
    @functools.wraps(hook)
    def in_order(state: S, bucket: GradBucket) -> Future[torch.Tensor]:
        done: Future[torch.Tensor] = Future()
        done.set_result(hook(state, bucket).wait())
        return done

    return in_order


def powersgd_numbers(model: nn.Module, rank: int) -> tuple[int, int, int]:
    """(numbers a step all-reduces without compression, with PowerSGD, tensors sent whole).

    PowerSGD's own rule (``powerSGD_hook._should_compress``, min_compression_rate 2): a gradient
    viewed as an n x m matrix goes as rank (n + m) numbers where that is under half of n m."""
    before = after = whole = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        n = p.shape[0] if p.dim() else 1
        m = p.numel() // max(n, 1)
        compressed = (n + m) * min(n, m, rank)
        before += n * m
        if compressed * 2 < n * m:
            after += compressed
        else:
            after += n * m
            whole += 1
    return before, after, whole


def _powersgd_note(model: nn.Module, *, ordered: bool) -> str:
    before, after, whole = powersgd_numbers(model, POWERSGD_RANK)
    order = (
        " On Gloo each bucket's all-reduces finish before the next bucket's start (issued in "
        "any order, the ranks' would not match), so they no longer overlap backward."
        if ordered
        else ""
    )
    return (
        f"Communication hook powersgd (powerSGD_hook, matrix_approximation_rank "
        f"{POWERSGD_RANK}, start_powerSGD_iter {POWERSGD_START}, error feedback and warm start "
        f"on): the first {POWERSGD_START} steps all-reduce whole gradients; from step "
        f"{POWERSGD_START + 1} each gradient matrix goes as two rank-{POWERSGD_RANK} factors, "
        f"{after:,} numbers a step instead of {before:,} ({before / max(after, 1):.0f}x fewer; "
        f"{whole} tensor(s) too small to gain, such as biases, still go whole). Each rank "
        f"adds what compression left out to its next step's gradient.{order}"
    )


# --- --shard-optimizer ---------------------------------------------------------------------


def plan_sharded(
    cfg: TrainConfig, rt: Runtime, model: nn.Module, net: nn.Module, notes: list[str]
) -> Plan:
    """DDP's plan with the run's optimizer wrapped in ZeroRedundancyOptimizer."""
    # The class and settings optimizer_make chooses (Adam, or SGD with momentum); it allocates no
    # state until its first step, so building it only to read them costs nothing.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    plain = optimizer_make(cfg, model)
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=type(plain), **plain.defaults
    )
    note = _shard_note(rt, optimizer, type(plain).__name__)  # a collective: every rank's share
    # A language model's gradients are clipped, as plan_simple's are (strategies.clipping).
    clip = GradClip(model.parameters()) if cfg.language else None
    return Plan(
        model=model,
        net=net,
        eval_net=model,
        optimizer=optimizer,
        step=step_default(net, optimizer, StepOptions(clip=clip)),
        grad_clip=clip,
        input_device=rt.device,
        output_device=rt.device,
        notes=[*notes, note],
        optimizer_gather=lambda: _optimizer_gather(optimizer, rt),
        optimizer_restore=lambda saved: _optimizer_restore(cfg, optimizer, saved),
    )


def _shard_note(rt: Runtime, optimizer: ZeroRedundancyOptimizer, kind: str) -> str:
    mine = [p.numel() for group in optimizer.optim.param_groups for p in group["params"]]
    shares = all_gather(rt, (len(mine), sum(mine)))
    total = max(sum(numbers for _, numbers in shares), 1)
    each = "; ".join(
        f"rank {rank}: {count} parameter(s), {numbers / total:.1%} of the numbers"
        for rank, (count, numbers) in enumerate(shares)
    )
    return (
        f"Optimizer sharded (--shard-optimizer): ZeroRedundancyOptimizer wraps {kind}; each "
        f"rank keeps and steps the state of its share of the parameters only, then broadcasts "
        f"them ({each}). ZeRO shares whole parameters, largest first, so the largest share, "
        f"{max(n for _, n in shares) / total:.1%} of plain DDP's optimizer state, is what a rank "
        "holds at most. Checkpoints consolidate the whole state on rank 0 in a torch "
        "optimizer's format: plain DDP resumes them, and they resume plain DDP's."
    )


def _optimizer_gather(optimizer: ZeroRedundancyOptimizer, rt: Runtime) -> dict[str, Any] | None:
    """The whole optimizer state on rank 0, as a plain optimizer's ``state_dict`` (a
    collective: every rank sends its share)."""
    optimizer.consolidate_state_dict(to=0)
    if not rt.is_main:
        return None
    state = optimizer.state_dict()
    # consolidate_state_dict keeps every rank's share on rank 0 until the next call: a whole
    # copy of the state, which sharding is there to avoid. The returned dict holds what is saved.
    optimizer._all_state_dicts = []  # type: ignore[attr-defined]  # private, no public way
    return state


def _optimizer_restore(
    cfg: TrainConfig, optimizer: ZeroRedundancyOptimizer, saved: dict[str, Any]
) -> str:
    if not holds_torch_optimizer({"optimizer": saved}):
        return (
            "The checkpoint's optimizer state is not a torch optimizer's (another strategy "
            "wrote it); the optimizer starts afresh."
        )
    # Every rank loaded the whole state; each keeps its share (load_state_dict blanks the others'
    # entries of the dict it is given: a copy, so the checkpoint stays whole).
    optimizer_state_load(optimizer, {**saved, "state": dict(saved["state"])}, lr=cfg.lr)
    # It also fills the wrapper's own `state`: this rank's share (the local optimizer's tensors,
    # `optimizer.optim`, which alone steps and saves them) and None for the other ranks'
    # parameters, which would break any reader of `optimizer.state`. ZeRO never reads it.
    optimizer.state.clear()
    return "The optimizer state was resumed; each rank kept its share (--shard-optimizer)."
