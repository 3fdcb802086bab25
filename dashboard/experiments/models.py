"""Experiments, their series (named scalars by step) and their log lines."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils.text import capfirst

from training.catalogue import MODEL_DEFAULT
from training.registry import MULTIPROCESS_STRATEGIES, REGISTRY, StrategyOption


class Status(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"


ACTIVE_STATUSES = (Status.QUEUED, Status.RUNNING)


class Backend(models.TextChoices):
    """What runs a run: Trainyard's own Celery workers, which it places itself, or a Slurm
    cluster's scheduler, which places one batch job per run (scheduling/slurm/)."""

    CELERY = "celery", "Celery workers"
    SLURM = "slurm", "Slurm"


class Dataset(models.TextChoices):
    """The built-in datasets, which every worker has; the field takes any name a worker
    reports (training/catalogue.py), checked at launch (core/catalogue_checks.py)."""

    MNIST = "mnist", "MNIST"
    FASHION_MNIST = "fashion-mnist", "Fashion-MNIST"


# One member per entry of training/registry.py (DDP = "ddp", "DistributedDataParallel"; ...).
Strategy = models.TextChoices(
    "Strategy",
    [(spec.name.upper().replace("-", "_"), (spec.name, spec.label)) for spec in REGISTRY],
)


def strategy_choices() -> list[tuple[str, str]]:
    """The field's choices, given as this function: migrations record a reference to it, not
    the list, so a strategy added to the registry needs no migration."""
    return Strategy.choices


# Strategies that start several processes and take `processes` (the others run one process).
PROCESS_STRATEGIES = MULTIPROCESS_STRATEGIES


class ZeroStage(models.IntegerChoices):
    ONE = 1, "ZeRO-1: optimizer state sharded"
    TWO = 2, "ZeRO-2: optimizer state and gradients sharded"


def option_title(option: StrategyOption) -> str:
    """An option's label as a field's or a fact's title: "Communication hook"; a name with a
    dot keeps its case ("torch.compile")."""
    return option.label if "." in option.label.split()[0] else capfirst(option.label)


class Optimizer(models.TextChoices):
    ADAM = "adam", "Adam"
    SGD = "sgd", "SGD"


def _who_asked() -> models.ForeignKey:
    """Who asked for something on a run (a Stop, a checkpoint); emptied if the user is deleted."""
    return models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )


class Experiment(models.Model):
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="experiments"
    )
    # Names, not choices: what can be trained is what the online workers report (their models,
    # their datasets, their image folders), so the launch checks decide, not the column.
    model = models.CharField(
        max_length=200,
        default=MODEL_DEFAULT,
        db_index=True,
        help_text="simple-cnn, a torchvision classifier (resnet18, ...) or a worker's plug-in",
    )
    dataset = models.CharField(
        max_length=100,
        default=Dataset.MNIST,
        help_text="mnist, fashion-mnist, imagefolder, cifar10, ... or a plug-in a worker has",
    )
    data_path = models.CharField(
        max_length=1000,
        blank=True,
        default="",
        help_text="with imagefolder: an image folder a worker reports (a path on it)",
    )
    # A language model's (byte-llama: training/text_catalogue.py): its size preset and its
    # window in bytes, as the run trains with them (the launch fills in the size's defaults);
    # blank and null for the other models. The launch checks judge them against the engine's
    # facts, so the columns take any name and length.
    model_size = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text="a language model's size preset (byte-llama: smoke, small, ...); blank: its "
        "default",
    )
    seq_len = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="bytes a language model reads at once (its training windows); null: the "
        "size's default",
    )
    # Tensor parallel's split of a language model's norms and residual stream by sequence
    # (torchtitan's plan, on by default); null where the run does not split one by tensor.
    sequence_parallel = models.BooleanField(
        null=True,
        blank=True,
        help_text="tensor parallel also splits a language model by sequence (default true); "
        "null: not read",
    )
    strategy = models.CharField(max_length=32, choices=strategy_choices, default=Strategy.DDP)
    processes = models.PositiveSmallIntegerField(
        default=2, help_text="processes of DDP, Hogwild and DeepSpeed; 1 for the others"
    )
    gpus = models.JSONField(default=list, blank=True, help_text="GPU ids; empty means CPU")
    # Across machines: `processes` ranks on each of `nodes` machines (torchrun's --nnodes and
    # --nproc-per-node). `machines` pins the run to named workers; empty leaves it to placement.
    nodes = models.PositiveSmallIntegerField(default=1, help_text="worker machines the run spans")
    machines = models.JSONField(
        default=list, blank=True, help_text="worker names to run on; empty: any that are free"
    )
    # Where the current attempt runs: one entry per machine, {worker, address, node_rank, ranks}.
    placement = models.JSONField(default=list, blank=True, help_text="machines and their ranks")
    epochs = models.PositiveSmallIntegerField(default=1)
    batch_size = models.PositiveIntegerField(default=64)
    lr = models.FloatField(default=1e-3)
    optimizer = models.CharField(max_length=16, choices=Optimizer.choices, default=Optimizer.ADAM)
    seed = models.IntegerField(default=1)
    zero_stage = models.PositiveSmallIntegerField(
        choices=ZeroStage.choices,
        null=True,
        blank=True,
        help_text="DeepSpeed ZeRO stage; empty for the other strategies",
    )
    # The other strategies' own options (training.registry declares their values and which
    # strategies read them; the launch checks validate them there). Empty: the strategy does not
    # read it, or its default. Null, not "", for the string ones too: like the others, null says
    # "not read" (the read JSON's null), and "" is no value of any option.
    comm_hook = models.CharField(  # noqa: DJ001
        max_length=16, null=True, blank=True, help_text="DDP's communication hook"
    )
    shard_optimizer = models.BooleanField(
        null=True, blank=True, help_text="DDP with ZeroRedundancyOptimizer"
    )
    accumulate = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="gradient accumulation steps (batches a step)"
    )
    compile = models.BooleanField(null=True, blank=True, help_text="torch.compile the model")
    precision = models.CharField(  # noqa: DJ001
        max_length=8, null=True, blank=True, help_text="fp32, bf16 or fp16 (autocast)"
    )
    pipeline_schedule = models.CharField(  # noqa: DJ001
        max_length=16, null=True, blank=True, help_text="the pipeline's schedule"
    )
    microbatches = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="micro-batches a batch, for the pipeline"
    )
    # A script run (strategy "script"): the user's own code, run under torchrun. Its entry point
    # is a file of the code folder, which is an upload (`code`, unpacked afresh for each attempt
    # under the run's folder) or a folder on the workers under their script roots (`code_path`);
    # empty for the other strategies. The script reads none of the engine's fields above.
    entrypoint = models.CharField(
        max_length=1000,
        blank=True,
        help_text="a script run's file to run, relative to its code folder (e.g. train.py)",
    )
    args = models.JSONField(
        default=list, blank=True, help_text="a script run's arguments, a list of strings"
    )
    code = models.ForeignKey(
        "CodeArchive",
        # The record of what ran: an upload a run used is kept (RESTRICT, not PROTECT: its
        # owner may still be deleted, with their runs and uploads together).
        on_delete=models.RESTRICT,
        null=True,
        blank=True,
        related_name="runs",
        help_text="a script run's code: an id from POST /api/code/ (yours); or code_path",
    )
    code_path = models.CharField(
        max_length=1000,
        blank=True,
        help_text="a script run's code as a folder on the workers, under their "
        "TRAINYARD_SCRIPT_ROOTS (an absolute path); or code",
    )

    # Where it runs (Backend); on Slurm, the partition and time limit its job asks for (empty:
    # TRAINYARD_SLURM_PARTITION, else the cluster's default; the partition's limit).
    backend = models.CharField(
        max_length=16,
        choices=Backend.choices,
        default=Backend.CELERY,
        help_text="celery (Trainyard's workers) or slurm (one batch job per run)",
    )
    partition = models.CharField(
        max_length=100, blank=True, help_text="the Slurm partition; empty: the default one"
    )
    time_limit_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="the Slurm job's time limit; empty: the partition's"
    )
    # The scheduler's side of a Slurm run, mirrored by polling (runs/slurm/reconcile.py): its
    # current job, the job's state and the reason it pends, and the job's restarts its current
    # attempt started at (SLURM_RESTART_COUNT: a later start of the same job is a requeue).
    scheduler_job_id = models.CharField(max_length=32, blank=True, db_index=True)
    scheduler_state = models.CharField(max_length=32, blank=True)
    scheduler_reason = models.CharField(max_length=200, blank=True)
    scheduler_restarts = models.PositiveIntegerField(default=0)

    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=255, blank=True, help_text="machine that ran it")
    error = models.TextField(blank=True)
    test_loss = models.FloatField(null=True, blank=True)
    test_accuracy = models.FloatField(null=True, blank=True, help_text="fraction 0..1")
    # A language model's evaluation (protocol 1.15), kept as test_loss is: the held-out loss in
    # bits a byte, the epoch's model FLOPs utilisation, and the latest texts it wrote.
    bits_per_byte = models.FloatField(null=True, blank=True, help_text="test loss in bits a byte")
    mfu = models.FloatField(
        null=True, blank=True, help_text="model FLOPs utilisation over the last epoch, 0..1"
    )
    samples = models.JSONField(
        default=list,
        blank=True,
        help_text="the latest texts a language model wrote at its evaluations: epoch, step, text",
    )

    # Progress, as of the last event the supervising task stored.
    epoch = models.PositiveIntegerField(default=0)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(null=True, blank=True)
    last_seq = models.IntegerField(default=0)
    notes = models.JSONField(default=list, blank=True, help_text="what the engine said it did")
    run_info = models.JSONField(default=dict, blank=True, help_text="the `started` event")
    # The latest per-rank figures ({step, epoch, time, ranks: [...]}), overwritten per flush so
    # that a reloaded page shows them without replaying every event.
    rank_stats = models.JSONField(default=dict, blank=True, help_text="latest per-rank figures")
    memory = models.JSONField(
        default=list,
        blank=True,
        help_text="what each rank held at the last epoch: parameter, gradient and optimizer "
        "state bytes, and its peak memory",
    )

    # The straggler the run's log and page announced (runs/stragglers.py): its rank, changed by
    # one conditional update so that a line is written once per change, and the sentence the
    # page's banner shows; null and empty while no rank is named.
    straggler_rank = models.PositiveIntegerField(null=True, blank=True)
    straggler_text = models.CharField(max_length=300, blank=True)
    # A run whose ranks make no step while their processes live, as its launcher said it
    # (protocol 1.13; runs/stalls.py): since when, where each rank is and its stack, and the
    # sentence ({since, ranks, text}, core/stalls.py's Stalled, the read JSON's). Null while it
    # steps: set and cleared by conditional updates, and cleared when the attempt ends.
    stalled = models.JSONField(
        null=True, blank=True, help_text="no step while the processes live: where each rank is"
    )

    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancelled_by = _who_asked()
    # The Stop asked is "Stop and resume from the last checkpoint" (a stalled run's banner): its
    # supervisor queues the run again instead of cancelling it (runs/lifecycle.py run_restart).
    resume_requested = models.BooleanField(
        default=False, help_text="the Stop asked starts a new attempt from the last checkpoint"
    )
    # A checkpoint asked for and not yet passed on to the training (the supervisor clears it).
    checkpoint_requested_at = models.DateTimeField(null=True, blank=True)
    checkpoint_requested_by = _who_asked()
    launcher_pid = models.IntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="last sign of life from the supervising task"
    )
    attempt = models.PositiveSmallIntegerField(default=0, help_text="attempts started so far")
    attempts = models.JSONField(default=list, blank=True, help_text="history of attempts")
    waiting_reason = models.CharField(max_length=300, blank=True)
    # The engine ends the run after the first epoch whose test accuracy reaches this (studies'
    # "stop at target"); empty trains every epoch.
    target_accuracy = models.FloatField(
        null=True, blank=True, help_text="stop after the epoch that reaches this test accuracy"
    )
    # Claim order: higher priority first, then first in, first out (staff set it).
    priority = models.SmallIntegerField(default=0, help_text="higher is claimed first")
    cloned_from = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="clones"
    )

    # What its owner says of it: labels to filter the list by, and a free text.
    tags = models.JSONField(default=list, blank=True, help_text="labels, e.g. baseline")
    note = models.TextField(blank=True)
    # Brought in from a TensorBoard log or a CSV (POST /api/experiments/import/): its series
    # are real, but no worker trained it here.
    imported = models.BooleanField(default=False)
    # Reported from outside (runs/reported.py): a script run on another machine creates the run
    # and posts its events (trainyard.init with a server). No worker runs it: it is created
    # running, never queued nor claimed, and has no heartbeat (the reaper leaves it alone);
    # `last_heard_at` is its last post, which the run page reads to say when it fell silent.
    # `report_key` is the script's own name for the run (every rank's, and a later
    # `trainyard sync`'s): the same key is the same run, so creating it again is harmless.
    reported = models.BooleanField(default=False)
    report_key = models.CharField(max_length=64, blank=True)
    last_heard_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The list pages through runs newest first (keyset on created_at, id), everyone's
            # for staff and one owner's for the others.
            models.Index(fields=["-created_at", "-id"], name="experiment_newest"),
            models.Index(fields=["owner", "-created_at", "-id"], name="experiment_owner_newest"),
        ]
        # A script runs arbitrary code as the worker's user: granted in the admin (staff have
        # it by being staff, core/access.py's script_allowed).
        permissions = [("run_script", "Can upload code and launch a script run")]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "report_key"],
                condition=~models.Q(report_key=""),
                name="one_reported_run_per_key",
            )
        ]

    # Nothing but the row here: how a run reads to people (active or not, its duration, its
    # dataset, devices, strategy and options in words) is core/descriptions.py's.
    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("experiment-detail", args=[self.pk])


class SeriesPoint(models.Model):
    """One value of one named series of a run, the narrow shape MLflow and Aim store: `key` is
    e.g. train_loss, test_accuracy, lr, rank/1/images_per_second or machine/host-a/cpu_percent;
    `step` the run's global optimizer step when it was taken, `time` seconds since the run
    started. The index serves "one key of one run, by step", which every chart asks."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="series")
    key = models.CharField(max_length=200)
    step = models.PositiveIntegerField()
    time = models.FloatField()
    value = models.FloatField(null=True, blank=True, help_text="null where it was not finite")

    class Meta:
        indexes = [models.Index(fields=["experiment", "key", "step"], name="series_run_key_step")]

    def __str__(self) -> str:
        return f"{self.key} at step {self.step} of #{self.experiment_id}"


class LogLine(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="logs")
    seq = models.IntegerField()
    time = models.FloatField(default=0)
    level = models.CharField(max_length=16, default="info")
    message = models.TextField()
    # The rank that wrote it (its stderr), or None for the run's own events and the dashboard's.
    rank = models.PositiveIntegerField(null=True, blank=True)
    # The worker machine whose supervisor relayed it, on a run over several machines ("" else).
    machine = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["seq", "id"]
        indexes = [models.Index(fields=["experiment", "rank", "seq"], name="log_run_rank_seq")]

    def __str__(self) -> str:
        return self.message[:80]

    def as_dict(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "time": self.time,
            "level": self.level,
            "message": self.message,
            "rank": self.rank,
            "machine": self.machine,
        }


class RunNode(models.Model):
    """One machine of a multi-node run's attempt, as its supervisor reports it: a heartbeat of
    its own (the reaper loses the whole run when any node falls silent), its processes, and how
    its part ended. Node 0 is the worker that claimed the run; the rows of an attempt are
    written by their own machines only, so no two processes update one row."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="nodes_run")
    attempt = models.PositiveSmallIntegerField()
    node_rank = models.PositiveSmallIntegerField()
    worker = models.CharField(max_length=255)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    launcher_pid = models.IntegerField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    returncode = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["attempt", "node_rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "attempt", "node_rank"], name="unique_run_node"
            )
        ]

    def __str__(self) -> str:
        return f"node {self.node_rank} ({self.worker}) of #{self.experiment_id} #{self.attempt}"


class Checkpoint(models.Model):
    """A checkpoint a run reported: at the end of an epoch, or mid-epoch when someone asked for
    one. The file lives on the worker that ran it (`worker`), under its TRAINYARD_RUNS_DIR; this
    web server can serve it only where that folder is shared."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="checkpoints")
    epoch = models.PositiveIntegerField(help_text="the epoch it ended, or the one it was taken in")
    step = models.PositiveIntegerField(default=0, help_text="global optimizer steps taken")
    requested = models.BooleanField(default=False, help_text="written on request, mid-epoch")
    path = models.TextField(help_text="as the training wrote it, on the worker's machine")
    size = models.BigIntegerField(null=True, blank=True, help_text="bytes, read by the worker")
    worker = models.CharField(max_length=255, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step"]
        constraints = [
            models.UniqueConstraint(fields=["experiment", "step"], name="unique_checkpoint_step")
        ]

    def __str__(self) -> str:
        return f"step {self.step} (epoch {self.epoch}) of #{self.experiment_id}"

    def get_absolute_url(self) -> str:
        return reverse("experiment-checkpoint", args=[self.experiment_id, self.step])

    def as_dict(self) -> dict[str, object]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "requested": self.requested,
            "path": self.path,
            "size": self.size,
            "worker": self.worker,
            "created": self.created.isoformat() if self.created else None,
            "url": self.get_absolute_url(),
            "api_url": reverse(
                "api-experiment-checkpoint-file", args=[self.experiment_id, self.step]
            ),
        }


class ProfileState(models.TextChoices):
    REQUESTED = "requested", "requested"  # asked for; the supervisor passes it on
    RECORDING = "recording", "recording"  # every rank records its steps
    READY = "ready", "ready"  # the traces are written and summarised
    FAILED = "failed", "failed"  # refused by the training, or the run ended first


PROFILE_IN_FLIGHT = (ProfileState.REQUESTED, ProfileState.RECORDING)


class Profile(models.Model):
    """A torch.profiler trace asked of a running run (runs/profiles.py): the request, then its
    recording, then every rank's trace file (on the worker's machine, under its
    TRAINYARD_RUNS_DIR, as checkpoints are) and the summary the training computed."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="profiles")
    steps = models.PositiveIntegerField(help_text="the steps asked for")
    state = models.CharField(
        max_length=16, choices=ProfileState.choices, default=ProfileState.REQUESTED
    )
    requested_by = _who_asked()
    requested_at = models.DateTimeField(auto_now_add=True)
    first_step = models.PositiveIntegerField(null=True, blank=True)
    recorded_steps = models.PositiveIntegerField(null=True, blank=True)
    # [{"rank", "path", "bytes", "dropped"}]: "dropped" says why a trace was not kept ("" if kept)
    traces = models.JSONField(default=list, blank=True)
    summary = models.JSONField(default=list, blank=True)  # the profile event's, one per rank
    message = models.TextField(blank=True, help_text="why it failed")
    worker = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["requested_at", "pk"]
        constraints = [
            # A second request while one is in flight is refused (a 409), whoever gets there.
            models.UniqueConstraint(
                fields=["experiment"],
                condition=models.Q(state__in=["requested", "recording"]),
                name="one_profile_in_flight",
            )
        ]

    def __str__(self) -> str:
        return f"profile {self.pk} ({self.state}) of #{self.experiment_id}"


class ReportedMark(models.Model):
    """How far one rank of a run reported from outside has been stored: the highest `seq` of
    its events taken (runs/reported.py). The client sends each rank's events in seq order and
    resends from after what was acknowledged, so an event at or below the mark is one already
    stored (a retry, a second `trainyard sync`): counted as a duplicate, stored once. One row a
    rank, not one an event: a run of a million points keeps a handful of rows."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="marks")
    attempt = models.PositiveSmallIntegerField()
    rank = models.PositiveIntegerField()
    seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "attempt", "rank"], name="one_mark_per_rank"
            )
        ]

    def __str__(self) -> str:
        return f"rank {self.rank} of #{self.experiment_id} at seq {self.seq}"


class CodeArchive(models.Model):
    """A folder of a user's code, uploaded as a .tar.gz or .zip (POST /api/code/): the archive is
    kept once by its content's hash (scripts/code.py's code_dir), a row per owner and content, so
    that the same upload again is the same id. Checked when stored: every member a file or a
    folder inside it, within the bounds."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    sha256 = models.CharField(max_length=64, help_text="the archive's bytes' SHA-256, hex")
    kind = models.CharField(max_length=8, help_text="tar.gz or zip")
    bytes = models.PositiveBigIntegerField(help_text="the archive's size as uploaded")
    files = models.PositiveIntegerField(help_text="regular files it holds")
    unpacked_bytes = models.PositiveBigIntegerField(help_text="their bytes, unpacked")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "sha256"], name="code_once_per_owner")
        ]

    def __str__(self) -> str:
        return f"code {self.pk} ({self.sha256[:12]}, {self.files} files)"
