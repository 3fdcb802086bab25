"""``hogwild``: N processes update one model in shared memory, asynchronously, without locks.

As pytorch/examples' mnist_hogwild: the parent builds the model and moves its parameters into
shared memory (``model.share_memory()``); each of its processes builds its own optimizer over
those same parameters and trains on its own shard of every global batch (``rank_batches``),
writing its updates straight into the shared parameters while the others do the same. Nothing
synchronises the steps; the parent synchronises the epochs only, to evaluate the shared model
and write the checkpoint while the processes wait.

The parent does not train: it is rank 0 of the protocol (it writes every event), collects the
processes' step reports from a queue, and is the process the caller holds. It drives its epochs
with the engine's driver (``training.epochs``), as the shared loop does. The dataset is one
shared copy too (``training.data.shared_data``): the parent creates it, the processes map it.

Processes are started with the ``spawn`` method, not ``fork``: a forked child cannot use CUDA
once the parent has (pytorch#40403), and forking after the parent's OpenMP thread pool has run
can hang the child in libgomp. Spawn costs one interpreter start and torch import per process,
about two seconds, once per run. The processes die with the parent: SIGTERM to the parent ends
them in its ``finally``, and a parent killed outright takes them along through
``PR_SET_PDEATHSIG``.

Read in this order, the spawner importing the process loop and nothing importing back:
``parent`` (``train``: the epochs, the step reports, the checkpoints), ``setup`` (the shared
model, data and resume), ``processes`` (the parent's side of its processes), ``process`` (the
loop each process runs), ``messages`` (what travels between them).
"""

from training.strategies.hogwild.parent import train

__all__ = ["train"]
