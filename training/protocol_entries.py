"""The entries nested in the protocol's events (training/protocol.py, their one home with it):
what a rank reports in a step or epoch, what a run's model and memory are, a profile's traces
and summary, a script run's record. Apart so that protocol.py reads as the events themselves;
protocol.py imports each of them, and readers import them from there.
"""

# No ``from __future__ import annotations``: as in protocol.py, it hides ``NotRequired`` from
# ``TypedDict``'s ``__required_keys__``.

from typing import NotRequired, TypedDict

# ---- nested entries --------------------------------------------------------------------------


class SharedTensor(TypedDict):
    """A tensor the run keeps in shared memory (dataset images/labels, Hogwild parameters)."""

    name: str
    dtype: str
    shape: list[int]
    bytes: int
    is_shared: bool  # in shared memory in every process of the run


class Stage(TypedDict):
    """One stage of a model-parallel run's model."""

    name: str
    device: str
    children: NotRequired[list[str]]  # 1.6: the model's top-level parts placed on it, in order
    parameters: NotRequired[int]  # 1.6: how many of the model's parameters it holds


class ModelInfo(TypedDict):
    """1.6: the model a run trains, as built for its dataset (``training.models.build``)."""

    name: str  # its catalogue name: "simple-cnn", a torchvision name, a plug-in's name
    source: str  # "built in", "torchvision" or "plug-in <distribution>"
    parameters: int
    in_channels: int  # the dataset's channels, which its first layer takes
    num_classes: int
    image_size: int  # the dataset's image size (square), which it was built for
    input_size: int  # the size its layers see: image_size, or what each batch is resized to
    # 1.15, a language model (byte-llama; in_channels and image_size 0, num_classes its
    # vocabulary, input_size its window): its size preset, the window in bytes (--seq-len), and
    # its training FLOPs per token, 6 x the parameters that multiply (not the embedding) + 12 x
    # layers x heads x head_dim x seq_len (torchtitan's and nanoGPT's estimate), MFU's numerator.
    model_size: NotRequired[str]
    seq_len: NotRequired[int]
    flops_per_token: NotRequired[int]


class RankReport(TypedDict):
    """One rank's (or Hogwild process's) figures for the same window as its step or epoch."""

    rank: int
    images_per_second: float
    data_seconds: float  # taking the batch and moving it to the device
    compute_seconds: float  # forward, backward and optimizer step
    rss_bytes: int  # resident memory
    # 1.9: where the window's wall time went (observe.phases and observe.collectives say what each
    # phase holds per strategy): data_seconds, these five and other_seconds add up to it;
    # compute_seconds is forward, backward and optimizer with the communication inside them, as
    # before.
    forward_seconds: NotRequired[float]
    backward_seconds: NotRequired[float]  # less DDP's wait for its last all-reduces
    optimizer_seconds: NotRequired[float]  # zero_grad and the update
    communication_seconds: NotRequired[float]  # blocked in collectives, not hidden
    other_seconds: NotRequired[float]  # the rest of the wall time (reports, requests), >= 0
    # 1.9: bytes this rank sent in the window, by the ring algorithms' count of the tensors
    # handed to collectives (an all-reduce of B bytes over N ranks: 2(N-1)/N x B).
    communication_bytes: NotRequired[int]
    # 1.14: how late this rank entered the window's collectives, per collective, after the
    # median of the other ranks (seconds, below 0 where earlier: who arrives last is the
    # straggler), and how many it entered; only where every rank entered the same number.
    arrived_late_seconds: NotRequired[float]
    collectives: NotRequired[int]
    # 1.15, a language model's: this rank's windows a second x the window's bytes.
    tokens_per_second: NotRequired[float]


class MemoryEntry(TypedDict):
    """1.7: what one rank holds at the end of an epoch (``training.observe.memory``). Bytes it holds
    itself: of a sharded parameter (FSDP2's DTensor), its local shard."""

    rank: int
    parameter_bytes: int
    gradient_bytes: int  # the .grad tensors left from the last step (0 where none are kept)
    optimizer_state_bytes: int  # the optimizer's per-parameter state tensors
    peak_bytes: int  # CUDA's max_memory_allocated on a GPU, else the process's peak RSS


class ProfileTrace(TypedDict):
    """1.10: one rank's trace file, Chrome trace JSON, gzipped (Perfetto opens it)."""

    rank: int
    path: str
    bytes: int


class ProfileOp(TypedDict):
    """1.10: an operator of a rank's trace (torch.profiler's key_averages)."""

    name: str
    calls: int
    self_cpu_seconds: float  # time in the operator itself, not in the ones it calls
    cpu_seconds: float  # with the ones it calls


class ProfileRankSummary(TypedDict):
    """1.10: what a rank's trace says (training.observe.trace_summary says how it is computed)."""

    rank: int
    ops: list[ProfileOp]  # the top operators by self CPU time, most first
    wall_seconds: float  # from the trace's first event to its last
    computation_seconds: float  # time some non-communication operator (or kernel) ran
    communication_seconds: float  # time some collective ran (c10d, gloo, nccl)
    overlap_seconds: float  # time both ran: communication hidden behind computation
    device: str  # "cpu": operators on the host; "cuda": kernels on the GPU


class GitState(TypedDict):
    """1.11: the repository a script run's folder is in."""

    commit: str
    dirty: bool  # changed since the commit (the diff is not empty)
    diff: str  # `git diff HEAD -- <code_dir>`, cut at 16 KiB


class ScriptInfo(TypedDict):
    """1.11: a script run's code, as the launcher ran it."""

    entrypoint: str  # relative to the code folder
    args: list[str]
    code_dir: str  # the folder it ran in, on the machine of rank 0
    stop_grace: float  # seconds the ranks have to agree on a Stop, save and leave (stop_pid)
    packages: list[str]  # the interpreter's distributions, "name==version", as pip freeze says
    git: NotRequired[GitState]  # where code_dir is in a git repository


class StalledRank(TypedDict):
    """1.13: one rank of a stalled run: the last collective it entered (``"<op> #<n>"``: its
    n-th; "" where it made none), whether it is still in it (it has not moved since: a step, a
    forward, a backward's end), its line for people against the latest collective any rank
    entered ("rank 1 never entered all_reduce #42: its last, all_reduce #41, done"), and its
    Python stack taken from outside its code (faulthandler, every thread)."""

    rank: int
    collective: str
    entered: bool
    stack: str
    waiting_since: NotRequired[float | None]  # Unix time it entered it, where still in it
    line: NotRequired[str]
