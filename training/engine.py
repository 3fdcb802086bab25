"""The training loop shared by every strategy that builds a ``Plan`` (``training.strategies``).

``train`` drives the steps, a screen each: ``_setup`` (model, resume, data, plan),
``_started_emit``, ``_epoch_train`` per epoch (``epoch_run``, evaluation, the epoch's event and
checkpoint) under ``training.epochs``' driver, which ends with the ``finished`` event. A strategy
that runs its own processes (Hogwild) is handed the whole run instead; it drives its epochs with
the same driver and builds its model and ``started`` event with the same ``training.epochs``,
and imports nothing here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.checkpoint import (
    Resumed,
    ResumePoint,
    checkpoint_request_refuse,
    checkpoint_write,
    resume_apply,
)
from training.config import TrainConfig
from training.data.batching import rank_batches, steps_per_epoch
from training.data.datasets import Dataset, text_dataset
from training.data.shared_data import dataset_for_ranks, text_for_ranks
from training.data.sources import dataset_open
from training.data.text import TextSplit, sample_seed, text_batches
from training.epochs import EpochStart, Ranks, epochs_drive, model_build, started_emit
from training.loop import Tested, evaluate, sample_bytes, sample_text, steps_run
from training.models.build import BuiltModel
from training.observe.collectives import collectives_time
from training.observe.language import test_fields, tokens_fields
from training.observe.memory import memory_report
from training.observe.meter import Window, window_report
from training.observe.peak import Peak, run_peak
from training.observe.phases import clock_for, clock_off
from training.observe.profiling import ProfileRecorder
from training.observe.rank_watch import RankWatch, rank_watched
from training.observe.reporting import epoch_emit, log_to
from training.process.run_requests import checkpoint_request_pending, checkpoint_request_take
from training.process.runtime import Runtime, all_gather, all_reduce_sum, machine_name
from training.protocol import EventWriter, SharedTensor
from training.strategies import Plan, own_trainer, plan_build
from training.strategies.schedule import lr_schedule, scheduled


def train(cfg: TrainConfig, rt: Runtime, events: EventWriter) -> None:
    """Train as ``cfg`` says on this rank, reporting on ``events`` (rank 0's are written)."""
    if not cfg.phases:
        clock_off()  # --no-phases: nothing timed, no phases reported (training.observe.phases)
    trainer = own_trainer(cfg)
    if trainer is not None:
        trainer(cfg, rt, events)
        return
    t_start = time.monotonic()
    clock_for(rt.device)
    if rt.distributed and cfg.phases:
        collectives_time()  # the communication phase and bytes (training.observe.collectives)
    run = _setup(cfg, rt)
    run = dataclasses.replace(run, peak=_started_emit(cfg, rt, events, run))
    profiles = ProfileRecorder(cfg, rt, events)  # profiles on request (SIGUSR2)
    # A hung rank named within a minute, not after the collective's timeout (rank_watch.py).
    with rank_watched(rt, events) as watch:
        if watch is not None:
            watch.forwards_seen(run.plan.eval_net)
        epochs_drive(
            cfg, rt, events, resume=run.resume, t_start=t_start,
            epoch_train=lambda work: _epoch_train(cfg, rt, events, run, work, profiles, watch),
            evaluate=lambda: _evaluate(cfg, rt, run),
        )  # fmt: skip


@dataclass(frozen=True)
class _Run:
    """What a run trains with, made ready before its ``started`` event."""

    plan: Plan
    built: BuiltModel  # the model as built for the dataset, and how (started.model_info)
    data: Dataset
    shared_tensors: list[SharedTensor]  # started.shared_tensors
    per_epoch: int  # optimizer steps per epoch
    resume: ResumePoint
    notes: list[str]  # started.notes: the plan's, then the resume's
    peak: Peak | None = None  # a language model's: what its MFU is measured against


def _setup(cfg: TrainConfig, rt: Runtime) -> _Run:
    built, state = model_build(cfg)
    data, shared_tensors = dataset_for(cfg, rt)
    plan = plan_build(cfg, rt, built.model)
    shard = plan.shard(rt.rank, rt.world_size)
    per_epoch = steps_per_epoch(
        len(data.train), cfg.batch_size, shard.count, cfg.step_limit, cfg.accumulate
    )
    resumed = Resumed(ResumePoint(), ())
    if state is not None:
        resumed = resume_apply(
            cfg,
            state,
            optimizer=plan.optimizer,
            takes_optimizer=plan.saves_optimizer,
            restore=plan.optimizer_restore,
            global_batch=_step_images(cfg, shard.count),
            per_epoch=per_epoch,
        )
        if plan.scaler is not None and state.get("scaler"):
            plan.scaler.load_state_dict(state["scaler"])  # fp16: the loss scale it had reached
    notes = [*plan.notes, *data.notes, *resumed.notes]
    if cfg.language:
        notes.append(lr_schedule(cfg.lr, per_epoch * cfg.epochs).words())
    return _Run(plan, built, data, shared_tensors, per_epoch, resumed.point, notes)


def _step_images(cfg: TrainConfig, slices: int) -> int:
    """Images in one optimizer step over the ``slices`` the data is cut into (the ranks, or
    tensor-parallel groups): --accumulate batches each."""
    return cfg.batch_size * cfg.accumulate * slices


def _started_emit(cfg: TrainConfig, rt: Runtime, events: EventWriter, run: _Run) -> Peak | None:
    """The ``started`` event (every rank joins the gather of PIDs) and the logs that follow;
    for a language model, the peak its MFU is measured against (found once all ranks are
    here: ``observe.peak``), which the event says."""
    gathered = all_gather(rt, (os.getpid(), rt.device_label, machine_name()))
    peak = None
    extra = dict(run.plan.started)
    if cfg.language:
        peak = run_peak(rt, cfg.precision, [machine for _, _, machine in gathered])
        extra |= {"peak_flops": peak.flops, "peak_source": peak.source}
    ranks = Ranks(
        devices=run.plan.devices or [label for _, label, _ in gathered],
        pids=[pid for pid, _, _ in gathered],
        machines=[machine for _, _, machine in gathered],
        # Under torchrun the ranks' parent is the launcher, the process the caller started.
        launcher_pid=os.getppid() if rt.distributed else os.getpid(),
        notes=run.notes,
        shared_tensors=run.shared_tensors,
        extra=extra,
        warnings=run.plan.warnings,
        batch_ranks=run.plan.shard(rt.rank, rt.world_size).count,
    )
    started_emit(
        cfg, rt, events, data=run.data, built=run.built, per_epoch=run.per_epoch,
        start_epoch=run.resume.start_epoch, ranks=ranks,
    )  # fmt: skip
    return peak


def _epoch_train(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    run: _Run,
    work: EpochStart,
    profiles: ProfileRecorder | None = None,
    watch: RankWatch | None = None,
) -> tuple[int, Tested]:
    """Train, evaluate and checkpoint one epoch; returns (global step, its test figures)."""
    epoch, step, done_before = work.epoch, work.step_base, work.skip
    batches = _epoch_batches(cfg, rt, run, epoch)
    plan = run.plan
    if cfg.language:  # warm-up and cosine, set from the global step (strategies.schedule)
        schedule = lr_schedule(cfg.lr, run.per_epoch * cfg.epochs)
        step_at = scheduled(plan.step, plan.optimizer, schedule, first=step + 1)
        plan = dataclasses.replace(plan, step=step_at)
    plan.net.train()
    figures = language_figures(cfg, run.built, run.plan, run.peak)
    step, whole = epoch_run(
        cfg=cfg, rt=rt, events=events, plan=plan, data=run.data,
        batches=batches[done_before:], epoch=epoch, step=step, done_before=done_before,
        profiles=profiles, watch=watch, figures=figures,
    )  # fmt: skip
    report = window_report(rt, whole, replicas(run.plan, rt))
    # Before evaluation, which may free or gather (FSDP2 reshards): what training held.
    memory = memory_report(rt, model=run.plan.model, optimizer=run.plan.optimizer)
    test_loss, test_accuracy = _evaluate(cfg, rt, run)
    if figures is not None:  # a language model's: tokens/s, MFU, bits per byte, its text
        report = figures(report) | test_fields(test_loss, _sample(cfg, rt, run, epoch))
    epoch_emit(
        events, rt, epoch=epoch, step=step, test_loss=test_loss, test_accuracy=test_accuracy,
        report=report, memory=memory,
    )  # fmt: skip
    if "compile_seconds" in report:
        log_to(
            events, rt, f"torch.compile took {report['compile_seconds']:.1f} s in epoch "
            f"{epoch}, reported apart from its compute time and images/s.",
        )  # fmt: skip
    if cfg.checkpoint_dir:
        # It answers a request made during the epoch's last step or evaluation.
        _checkpoint_save(cfg, rt, events, run.plan, epoch=epoch, step=step)
    return step, (test_loss, test_accuracy)


def _epoch_batches(cfg: TrainConfig, rt: Runtime, run: _Run, epoch: int) -> list[torch.Tensor]:
    """This rank's batches of ``epoch``: indices of its images in the epoch's seeded order, or
    a language model's window offsets, drawn per global step (``training.data.text``)."""
    shard = run.plan.shard(rt.rank, rt.world_size)
    if isinstance(run.data.train, TextSplit):
        return text_batches(
            run.data.train, batch_size=cfg.batch_size, count=shard.count, rank=shard.rank,
            seed=cfg.seed, first_step=(epoch - 1) * run.per_epoch + 1, steps=run.per_epoch,
            accumulate=cfg.accumulate,
        )  # fmt: skip
    return rank_batches(
        len(run.data.train), cfg.batch_size, shard.count, shard.rank, cfg.seed, epoch,
        cfg.accumulate,
    )[: run.per_epoch]  # fmt: skip


def language_figures(
    cfg: TrainConfig, built: BuiltModel, plan: Plan, peak: Peak | None
) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """What a language model's step and epoch events add to the meter's report: tokens/s,
    MFU against ``peak`` and the last step's gradient norm (``observe.language``); None for a
    classifier. Public: ``python -m training.bench lm`` runs the engine's loop with it."""
    if not cfg.language or cfg.seq_len is None:
        return None
    seq_len, flops = cfg.seq_len, int(built.info.get("flops_per_token", 0))
    clip = plan.grad_clip

    def figures(report: dict[str, Any]) -> dict[str, Any]:
        fields = tokens_fields(report, seq_len=seq_len, peak=peak, flops_per_token=flops)
        if clip is not None and clip.last is not None:
            fields["grad_norm"] = round(float(clip.last), 6)
        return fields

    return figures


def _evaluate(cfg: TrainConfig, rt: Runtime, run: _Run) -> Tested:
    plan = run.plan
    # A language model's windows are as long as its training's: no larger batch than those.
    size = min(cfg.test_batch_size, cfg.batch_size) if cfg.language else cfg.test_batch_size
    with plan.evaluating(), plan.autocast():
        return evaluate(
            plan.eval_net, run.data, rt, size, plan.input_device,
            plan.output_device, shard=plan.shard(rt.rank, rt.world_size),
        )  # fmt: skip


def _sample(cfg: TrainConfig, rt: Runtime, run: _Run, epoch: int) -> str:
    """The text the model writes after the held-out text's first window (every rank of a
    tensor-parallel group writes it with the others; rank 0's is reported)."""
    plan, test = run.plan, run.data.test
    assert isinstance(test, TextSplit)
    prompt = test.tokens[: test.seq_len]
    with plan.evaluating(), plan.autocast():
        seed = sample_seed(cfg.seed, epoch)
        return sample_text(
            plan.eval_net, prompt, device=plan.input_device, seed=seed, length=sample_bytes()
        )


def epoch_run(
    *,
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    plan: Plan,
    data: Dataset,
    batches: Sequence[torch.Tensor],
    epoch: int,
    step: int,
    done_before: int = 0,
    profiles: ProfileRecorder | None = None,
    watch: RankWatch | None = None,
    figures: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[int, Window]:
    """Train on ``batches`` (the epoch's, after the ``done_before`` a resumed run had done),
    emitting step events (``figures`` adds a language model's to each), writing requested
    checkpoints and recording requested profiles, and telling the stall ``watch`` of each
    step; returns (global step, the epoch's window)."""
    # On the output device: that is where the loss is (model-parallel: the last stage's).
    interval, whole = Window(plan.output_device), Window(plan.output_device)
    slices = plan.shard(rt.rank, rt.world_size).count
    timings = steps_run(
        plan.step, data, batches, plan.input_device, plan.output_device, plan.compile_clock
    )
    for i, timing in enumerate(timings):
        step += 1
        if watch is not None:
            watch.stepped(step)
        interval.add(timing)
        whole.add(timing)
        last = i == len(batches) - 1
        # Step 1 too (as pytorch/examples logs batch 0): the first point shows without waiting.
        reported = step % cfg.log_interval == 0 or step == 1 or last
        if reported:
            # Every rank takes this branch at the same step: the all-gather inside matches up.
            report = window_report(rt, interval, replicas(plan, rt))
            if figures is not None:
                report = figures(report)
            lr = float(plan.optimizer.param_groups[0]["lr"])
            events.emit("step", epoch=epoch, step=step, lr=lr, **report)
        if profiles is not None:
            # Between two windows where reported: its all-reduce counts in neither.
            profiles.after_step(step=step, reported=reported, last=last)
        if reported:
            interval = Window(plan.output_device)
        # Rank 0 writes: its replica is every rank's. At the epoch's last step the request
        # waits for the epoch's own checkpoint, a few seconds later.
        if not checkpoint_asked(plan, rt):
            continue
        if cfg.checkpoint_dir is None:
            if rt.is_main:
                checkpoint_request_take()
                checkpoint_request_refuse(events, step=step)
        elif not last:
            trained = (done_before + i + 1) * _step_images(cfg, slices)
            _checkpoint_save(
                cfg, rt, events, plan, epoch=epoch, step=step, images_into_epoch=trained
            )
    return step, whole


def replicas(plan: Plan, rt: Runtime) -> int:
    """How many ranks train on each image together (a tensor-parallel group), else 1."""
    return rt.world_size // plan.shard(rt.rank, rt.world_size).count


def _checkpoint_save(
    cfg: TrainConfig,
    rt: Runtime,
    events: EventWriter,
    plan: Plan,
    *,
    epoch: int,
    step: int,
    images_into_epoch: int | None = None,
) -> None:
    """Every rank calls this (ZeRO's and FSDP2's gathers are collectives); rank 0 takes the
    pending request, which this checkpoint answers, and writes."""
    # Gathers are collectives, taken in this order on every rank.
    model_state = plan.model_gather() if plan.model_gather is not None else None
    optimizer_state = optimizer_state_of(plan, rt)
    if rt.is_main:
        if model_state is None:
            model_state = plan.model.state_dict()
        # fp16's loss scale, so that a resumed run does not search for it again.
        scaler = {"scaler": plan.scaler.state_dict()} if plan.scaler is not None else None
        checkpoint_write(
            cfg, events, model_state=model_state, optimizer_state=optimizer_state,
            epoch=epoch, step=step, answers_request=checkpoint_request_take(),
            images_into_epoch=images_into_epoch, extra=scaler,
        )  # fmt: skip


def optimizer_state_of(plan: Plan, rt: Runtime) -> dict[str, Any] | None:
    """The optimizer state a checkpoint holds, on rank 0. Every rank calls this: where the
    state is partitioned (ZeRO), gathering it is a collective."""
    if plan.optimizer_gather is not None:
        return plan.optimizer_gather()
    return plan.optimizer.state_dict() if plan.saves_optimizer and rt.is_main else None


def checkpoint_asked(plan: Plan, rt: Runtime) -> bool:
    """Whether a checkpoint is requested; where writing one is a collective, all ranks learn
    rank 0's answer (one tiny all-reduce a step, for those strategies only)."""
    pending = rt.is_main and checkpoint_request_pending()
    if plan.optimizer_gather is None:
        return pending
    return all_reduce_sum(rt, [1.0 if pending else 0.0])[0] > 0


def dataset_for(cfg: TrainConfig, rt: Runtime) -> tuple[Dataset, list[SharedTensor]]:
    """The run's data and ``started.shared_tensors``: under torchrun one shared copy per
    machine (where it stays resident), else this process's own (nothing to share with)."""
    if cfg.language and cfg.seq_len is not None:  # text: its bytes, as tensors
        if rt.distributed:
            return text_for_ranks(cfg.dataset, Path(cfg.data_dir), rt, cfg.data_path, cfg.seq_len)
        return text_dataset(cfg.dataset, Path(cfg.data_dir), cfg.data_path, cfg.seq_len), []
    if rt.distributed:
        return dataset_for_ranks(cfg.dataset, Path(cfg.data_dir), rt, cfg.data_path, cfg.workers)
    data = dataset_open(cfg.dataset, Path(cfg.data_dir), cfg.data_path, workers=cfg.workers)
    return data, []
