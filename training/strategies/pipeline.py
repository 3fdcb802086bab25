"""``pipeline``: the model cut into one stage per torchrun rank, each batch run through them as
micro-batches (``torch.distributed.pipelining``: ``PipelineStage`` and ``ScheduleGPipe`` or
``Schedule1F1B``, chosen by --pipeline-schedule), or into two stages a rank
(``interleaved-1f1b``: looped, stage ``i`` on rank ``i mod N``, ``ScheduleInterleaved1F1B``;
``zero-bubble``: in a V, ``ScheduleZBVZeroBubble``, whose backward splits into the input's and
the weights' gradients to fill the bubble). All four run on Gloo here (torch 2.14.1).

A language model (``byte-llama``) is cut by layer (``byte_llama.parallelize.pipeline_stages``:
the embedding with the first layers, norm and output with the last), a plug-in's by the parts
its build declares (as below, nothing flattened), its loss per byte, its gradients clipped by
their norm over every stage (one all-reduce of the squares).

The stages come from the model's declared split, the one ``model-parallel`` places
(``models.build.model_stages``: the built-in's ``features`` and ``classifier``, torchvision's
top-level children, a plug-in's ``build.stages``), cut into --nproc stages balanced by
parameters (``stages_split``). A stage runs its parts one after another, flattening the input of
a part that starts with a linear layer (torchvision's ``torch.flatten(x, 1)`` before its head);
before any rank splits anything, that composition is checked against the model's own forward on
a probe batch, and a model whose forward does more between its parts is refused.

Every rank builds the whole model (the same seed, or the checkpoint's weights), keeps its own
stage, and moves the other stages' parts to the meta device: it holds only its part, which is the
point (the ``memory`` of each epoch shows it). All ranks take the same batch of --batch-size
images (the global batch), which the schedule cuts into --microbatches micro-batches; rank 0
feeds the first stage and the last stage computes the loss. Each micro-batch's loss is its summed
cross-entropy over the batch's image count, with ``scale_grads=False``, so the micro-batches' sum
is the batch's mean loss and gradients are single's at that batch (a short last batch of an epoch
is padded to --batch-size with ignored labels; a BatchNorm in the model would see the padding).
The last stage broadcasts the loss, so that rank 0 reports it.

Evaluation and checkpoints gather the whole model on every rank, each stage broadcasting its
parameters and buffers (``gathered``): every rank then evaluates the test split with the model's
own forward, and rank 0 saves the plain model's state dict, so a pipeline checkpoint resumes
under ``single`` or ``ddp`` and theirs under ``pipeline``. Optimizer state is gathered the same
way, renumbered as the whole model's optimizer numbers its parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
    schedules,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from training.checkpoint import holds_torch_optimizer
from training.config import TrainConfig
from training.data.batching import DataShard
from training.data.datasets import dataset_meta
from training.models.build import ModelRefused, Part, model_stages, stages_split
from training.models.byte_llama.model import ByteLlama
from training.models.byte_llama.parallelize import LanguageStage, pipeline_stages
from training.observe.collectives import pipelining_time
from training.observe.memory import tensor_bytes
from training.observe.phases import method_timed, phase
from training.process.runtime import Runtime, all_gather
from training.registry import PIPELINE_SCHEDULE, STAGES_PER_RANK, pipeline_stages_count
from training.strategies.clipping import GradClip
from training.strategies.common import Plan, optimizer_make
from training.strategies.full_state import by_name, by_number
from training.strategies.model_parallel import stage_table
from training.text_catalogue import BYTE_VOCAB

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
# The schedules whose ranks hold several stages (STAGES_PER_RANK): they take a list of them.
MULTI_SCHEDULES = {
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zero-bubble": ScheduleZBVZeroBubble,
}
IGNORED = -100  # cross_entropy's ignore_index: the labels of a short last batch's padding


class StageModule(nn.Module):
    """One stage: its parts run one after another. The first stage also applies the model's own
    forward pre-hooks (an input resize); ``flatten`` names the parts whose input is flattened to
    (batch, features) first."""

    def __init__(self, model: nn.Module, parts: list[Part], *, first: bool, flatten: set[str]):
        super().__init__()
        self.names = [name for name, _ in parts]
        self.parts = nn.ModuleList([module for _, module in parts])
        self.flatten = flatten
        # Not a child: the root's hooks only, its parameters are the parts'.
        self.root_hooks = list(model._forward_pre_hooks.values()) if first else []
        self.root = [model]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for hook in self.root_hooks:
            result = hook(self.root[0], (x,))
            if result is not None:
                x = result[0]
        for name, part in zip(self.names, self.parts, strict=True):
            if name in self.flatten and x.dim() > 2:
                x = torch.flatten(x, 1)
            x = part(x)
        return x


def _starts_linear(module: nn.Module) -> bool:
    first = next((m for m in module.modules() if any(True for _ in m.parameters(False))), None)
    return isinstance(first, nn.Linear)


def stage_modules(model: nn.Module, stages: list[list[Part]]) -> list[StageModule]:
    """Each stage as a module: the parts that start with a linear layer flatten their input."""
    flatten = {name for parts in stages for name, module in parts if _starts_linear(module)}
    return [
        StageModule(model, parts, first=i == 0, flatten=flatten) for i, parts in enumerate(stages)
    ]


def composition_check(
    name: str, model: nn.Module, modules: list[StageModule], probe: torch.Tensor
) -> None:
    """Refused (ModelRefused) where running the stages one after another is not the model's own
    forward, on a probe batch (two random images, or windows of bytes)."""
    device = next(model.parameters()).device
    probe = probe.to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model(probe)
            x = probe
            for module in modules:
                x = module(x)
        same = x.shape == expected.shape and torch.allclose(x, expected, atol=1e-5, rtol=1e-4)
        problem = "" if same else "gives other outputs"
    except (RuntimeError, ValueError, TypeError) as exc:
        problem = f"fails ({str(exc).splitlines()[0][:200]})"
    finally:
        model.train(was_training)
    if problem:
        raise ModelRefused(
            f"pipeline runs {name}'s parts one after another, and that {problem}: its forward "
            "does more between its parts than a flatten before a linear head; pick another "
            "strategy or model, or declare its stages (a plug-in's build.stages(model))"
        )


Stage = StageModule | LanguageStage


def stage_owners(schedule: str, world: int) -> list[int]:
    """The rank of each stage, in the model's order: one a rank in order; looped where a rank
    holds several (interleaved 1F1B: stage ``i`` on rank ``i mod world``); in a V for ZB-V
    (rank ``r`` holds stages ``r`` and ``2 world - 1 - r``, so rank 0 holds the first and the
    last)."""
    count = pipeline_stages_count(schedule, world)
    if schedule == "zero-bubble":
        return [i if i < world else count - 1 - i for i in range(count)]
    return [i % world for i in range(count)]


def _stages(cfg: TrainConfig, count: int, model: nn.Module) -> tuple[list[Stage], list[list[Part]]]:
    """The ``count`` stages and the parts each runs: a language model's by layer
    (``byte_llama.parallelize``), any other's by its declared parts, balanced by parameters."""
    if isinstance(model, ByteLlama):
        cut = pipeline_stages(model, count)
        return list(cut), [list(zip(m.names, m.parts, strict=True)) for m in cut]
    parts = model_stages(cfg.model, model, stages=count, strategy="pipeline")
    stages = stages_split(parts, count)
    seeded = torch.Generator().manual_seed(0)  # its own: the run's generator is untouched
    if cfg.language:  # a plug-in's parts in order, over its hidden states: nothing flattened
        modules = [StageModule(model, p, first=i == 0, flatten=set()) for i, p in enumerate(stages)]
        probe = torch.randint(0, BYTE_VOCAB, (2, cfg.seq_len or 1), generator=seeded)
    else:
        modules = stage_modules(model, stages)
        meta = dataset_meta(cfg.dataset, Path(cfg.data_dir), cfg.data_path)
        shape = (meta.channels, meta.image_size, meta.image_size)
        probe = torch.randn(2, *shape, generator=seeded)
    composition_check(cfg.model, model, modules, probe)
    return list(modules), stages


def plan_build(cfg: TrainConfig, rt: Runtime, model: nn.Module) -> Plan:
    model.to(rt.device)
    owners = stage_owners(cfg.pipeline_schedule, rt.world_size)
    modules, stages = _stages(cfg, len(owners), model)
    placed = list(zip(modules, owners, strict=True))
    mine = nn.ModuleList([m for m, owner in placed if owner == rt.rank])
    for module in [part for m, owner in placed if owner != rt.rank for part in m.parts]:
        module.to("meta")  # this rank holds its stages only
    optimizer = optimizer_make(cfg, mine)
    pipe = Pipe(cfg, rt, model, modules, optimizer)
    several = len(owners) > rt.world_size  # say which rank holds each stage
    labels = [f"rank {r}, {rt.device}" if several else str(rt.device) for r in owners]
    return Plan(
        model=model,
        net=mine,
        eval_net=model,
        optimizer=optimizer,
        step=pipe.step,
        input_device=rt.device,
        output_device=rt.device,
        notes=[_note(cfg, rt, model, modules)],
        started={"stages": stage_table(stages, labels)},
        model_gather=pipe.model_gather,
        optimizer_gather=pipe.optimizer_gather,
        optimizer_restore=pipe.optimizer_restore,
        evaluating=pipe.gathered,
        data_shard=DataShard(0, 1),
        grad_clip=pipe.clip,
    )


class Pipe:
    """This rank's stages in the schedule: the step, and the gathers of the whole model."""

    def __init__(
        self,
        cfg: TrainConfig,
        rt: Runtime,
        model: nn.Module,
        modules: list[Stage],
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.cfg, self.rt, self.model, self.modules = cfg, rt, model, modules
        self.optimizer = optimizer
        self.owners = stage_owners(cfg.pipeline_schedule, rt.world_size)
        held = [i for i, owner in enumerate(self.owners) if owner == rt.rank]
        # Feeds the first stage, takes the last one's loss (in a V, rank 0 does both).
        self.first, self.last = 0 in held, len(modules) - 1 in held
        stages: list[_PipelineStageBase] = [
            PipelineStage(modules[i], i, len(modules), rt.device) for i in held
        ]
        # The schedule's phases (training.observe.phases, .collectives): its stages' chunks are
        # forward and backward, its sends, receives and waits for the other stages communication.
        for stage in stages:
            method_timed(stage, "forward_one_chunk", "forward")
            method_timed(stage, "backward_one_chunk", "backward")
            method_timed(stage, "backward_weight_one_chunk", "backward")  # zero bubble's W
        pipelining_time(schedules)
        # The step's real images (a language model's: the bytes it predicts), the loss's
        # denominator.
        self.images = cfg.batch_size
        mine = [p for i in held for p in modules[i].parameters()]
        # A language model's gradients are clipped by the norm over every stage's.
        self.clip = GradClip(mine, reduce=self._summed) if cfg.language else None
        multi = MULTI_SCHEDULES.get(cfg.pipeline_schedule)
        m, loss = cfg.microbatches, self._loss
        self.schedule: schedules._PipelineSchedule = (
            multi(stages, n_microbatches=m, loss_fn=loss, scale_grads=False)
            if multi is not None
            else SCHEDULES[cfg.pipeline_schedule](
                stages[0], n_microbatches=m, loss_fn=loss, scale_grads=False
            )
        )
        # The first step sets the stages up: a forward on the meta device each, their output
        # shapes passed on (forward, not the schedule's bookkeeping: it would swell "other").
        for setup in ("_initialize_stage", "_initialize_stages"):  # a schedule of one, of several
            if hasattr(self.schedule, setup):
                method_timed(self.schedule, setup, "forward")
        # The whole model's parameter names, in its optimizer's order, and this rank's stages'.
        self.names = [name for name, _ in model.named_parameters()]
        ids = {id(p): name for name, p in model.named_parameters()}
        self.mine = [ids[id(p)] for p in mine]

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """A micro-batch's share of the batch's mean loss (the shares sum to it); the
        schedule calls it after the last stage's forward chunk, so it is forward too."""
        with phase("forward"):
            summed = F.cross_entropy(
                output.flatten(0, -2).float(), target.flatten(), ignore_index=IGNORED,
                reduction="sum",
            )  # fmt: skip
            return summed / self.images

    def _summed(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the stages (a collective)."""
        if self.rt.distributed:
            dist.all_reduce(value)
        return value

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # The schedule interleaves the micro-batches' forwards and backwards with the stages'
        # sends, receives and waits, each timed as its phase (see __init__); its bookkeeping
        # between them is "other".
        with phase("optimizer"):
            self.optimizer.zero_grad(set_to_none=True)
        self.images = y.numel()
        short = self.cfg.batch_size - len(y)
        if short > 0:  # the epoch's last batch: padded, the padding's labels ignored
            x = torch.cat([x, x.new_zeros((short, *x.shape[1:]))])
            y = torch.cat([y, y.new_full((short,), IGNORED)])
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        target = y if self.last else None
        self.schedule.step(*args, target=target, losses=losses if self.last else None)
        with phase("optimizer"):
            if self.clip is not None:
                self.clip()
            self.optimizer.step()
        loss = torch.stack(losses).sum().detach() if self.last else torch.zeros((), device=y.device)
        if self.rt.distributed:
            dist.broadcast(loss, src=self.owners[-1])  # the last stage's, to rank 0
        return loss

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """The whole model on every rank: each stage broadcasts its parameters and buffers to
        the ranks that hold them on the meta device; afterwards they go back there."""
        with torch.no_grad():
            for owner, module in zip(self.owners, self.modules, strict=True):
                if owner != self.rt.rank:
                    module.to_empty(device=self.rt.device)
                for tensor in [*module.parameters(), *module.buffers()]:
                    if self.rt.distributed:
                        dist.broadcast(tensor, src=owner)
        try:
            yield
        finally:
            for owner, module in zip(self.owners, self.modules, strict=True):
                if owner != self.rt.rank:
                    module.to("meta")

    def model_gather(self) -> dict[str, Any] | None:
        """The whole model's state on rank 0 (None on the others): every rank joins."""
        with self.gathered():
            if not self.rt.is_main:
                return None
            return {k: v.cpu() for k, v in self.model.state_dict().items()}

    def optimizer_gather(self) -> dict[str, Any] | None:
        """The whole model's optimizer state on rank 0, numbered as its optimizer would."""
        state = by_name(self.optimizer.state_dict(), self.mine)
        states = all_gather(self.rt, _to_cpu(state))
        if not self.rt.is_main:
            return None
        merged = {
            "state": {k: v for s in states for k, v in s["state"].items()},
            "param_groups": [{**states[0]["param_groups"][0], "params": list(self.names)}],
        }
        return by_number(merged, self.names)

    def optimizer_restore(self, saved: dict[str, Any]) -> str:
        if not holds_torch_optimizer({"optimizer": saved}):
            return (
                "The checkpoint's optimizer state is not a torch optimizer's (another strategy "
                "wrote it); the optimizer starts afresh."
            )
        named = by_name(saved, self.names)
        mine = {
            "state": {k: v for k, v in named["state"].items() if k in self.mine},
            "param_groups": [{**named["param_groups"][0], "params": list(self.mine)}],
        }
        self.optimizer.load_state_dict(by_number(mine, self.mine))
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr  # the saved learning rate would silently override --lr
        return "The optimizer state was resumed, each stage taking its parameters' share."


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


def _note(cfg: TrainConfig, rt: Runtime, model: nn.Module, modules: list[Stage]) -> str:
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    owners = stage_owners(cfg.pipeline_schedule, rt.world_size)
    held = [m for m, owner in zip(modules, owners, strict=True) if owner == 0]
    mine = sum(tensor_bytes(p) for m in held for p in m.parameters())
    stages = "; ".join(
        f"stage {i}{f' (rank {o})' if len(owners) > rt.world_size else ''}: {', '.join(m.names)}"
        for i, (m, o) in enumerate(zip(modules, owners, strict=True))
    )
    schedule = str(dict(PIPELINE_SCHEDULE.choices)[cfg.pipeline_schedule]).split(":")[0]
    per = STAGES_PER_RANK.get(cfg.pipeline_schedule, 1)
    each = "one a rank" if per == 1 else f"{per} a rank"
    return (
        f"Pipeline ({schedule}) over {len(owners)} stage(s), {each} ({stages}); each batch "
        f"of {cfg.batch_size} cut into {cfg.microbatches} micro-batches of "
        f"{cfg.batch_size // cfg.microbatches}. Rank 0 holds {mine:,} of {whole:,} parameter "
        "bytes; every rank trains on the same batch, so the global batch is --batch-size "
        f"({cfg.batch_size})."
    )
