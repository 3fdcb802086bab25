"""Numbers as people read them, for every page and message: written once, on the server."""

from __future__ import annotations

from typing import Any


def bytes_text(value: int | float | None) -> str:
    """Binary units, the way /dev/shm and GPU memory are sized."""
    if value is None:
        return "?"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


# Why a machine has no GPU, in words, for NVML's error strings (pynvml.NVMLError's str): the
# devices page says "no GPU (NVIDIA's library is not installed)", not NVML's words.
NO_GPU_REASONS = {
    "NVML Shared Library Not Found": "NVIDIA's library is not installed",
    "Driver Not Loaded": "NVIDIA's driver is not loaded",
    "Insufficient Permissions": "this worker's user may not read the GPUs",
    "Function Not Found": "NVIDIA's library is older than its driver",
    "RM has detected an NVML/RM version mismatch.": "NVIDIA's library and driver versions differ",
}
NO_GPU_DEVICE = "no GPU (NVIDIA's library sees none)"


def no_gpu_text(nvml_error: str) -> str:
    """ "no GPU (NVIDIA's library is not installed)": why a machine has no GPU, from NVML's
    error string; an error not known here is quoted as NVML says it."""
    reason = NO_GPU_REASONS.get(nvml_error.strip(), f"NVML says: {nvml_error.strip()}")
    return f"no GPU ({reason})"


def gpu_status_text(status: str | None) -> str:
    """A worker's gpu_status as the page says it; a report from before no_gpu_text said NVML's
    words ("no GPU: NVML Shared Library Not Found")."""
    if not status:
        return "no GPU (not reported)"
    if status.startswith("no GPU: "):
        said = status.removeprefix("no GPU: ")
        return NO_GPU_DEVICE if said == "NVML works but reports no device" else no_gpu_text(said)
    return status


def words_joined(words: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} and {words[-1]}"


def ranks_text(ranks: list[int]) -> str:
    """ "rank 0", "ranks 1, 2": the global ranks that ran on one machine."""
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def format_duration(seconds: float | None) -> str:
    """12s, 3m 05s, 1h 02m: formatDuration() in static/js/common.js ticks it on live."""
    if seconds is None:
        return "—"
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


# The queue (/queue/ and GET /api/queue/): how a start is estimated, said once.
QUEUE_ESTIMATE_METHOD = (
    "Estimated start: a running run is expected to end at its pace so far (time since its start "
    "x steps left / steps done) once it is a tenth of the way through, before that (its time is "
    "then mostly start-up) to take as long as the last finished runs like it; queued runs to "
    "take as long as the last finished runs of the same strategy, model, dataset, processes, "
    "nodes, epochs and batch size; then the queue is replayed in claim order on the machines "
    "online. Unknown where a run it waits for is less than a tenth of the way through and "
    "nothing like it has finished. Each estimate says what it rests on."
)
# How the queue orders runs between users (scheduling/fair.py), said in one line on the page.
QUEUE_ORDER = (
    "Users take turns: the next run is the next of the user with the fewest runs running (on a "
    "tie, the one whose last run started longest ago); priority, then launch time, orders only "
    "each user's own runs."
)
QUEUE_BASIS_FREE = "its devices are free now"
QUEUE_BASIS_UNKNOWN = (
    "no estimate: a run it waits for has not gone far enough to say when it ends, and nothing "
    "like it has finished"
)


def queue_basis_pace_text(*, run: int, step: int, total: int, seconds: float) -> str:
    """A running run's end expected from its pace so far."""
    done = f"{step:,} of {total:,} steps in {format_duration(seconds)}"
    return f"#{run} ends at its pace so far ({done})"


def queue_basis_typical_text(*, run: int, runs: int, seconds: float) -> str:
    """A run's length expected from finished runs like it."""
    like = (
        "the last finished run like it" if runs == 1 else f"the last {runs} finished runs like it"
    )
    return f"#{run} ends {format_duration(seconds)} after its start, as {like} took"


def queue_basis_wait_text(bases: list[str]) -> str:
    """A queued run's start: after the ends of these runs, each with how it was expected."""
    said = [basis for basis in bases if basis]
    return "when " + "; and ".join(said) if said else QUEUE_BASIS_UNKNOWN


QUEUE_OTHERS_RUN = "another user's run"

# Stop and Cancel ask first where a run was launched this long ago: ending it throws away the
# time it took (its training, or its place in the queue). A run of a minute needs no question.
LONG_RUN_SECONDS = 300


def end_confirm(*, name: str, launched_at: float, queued: bool = False) -> dict[str, Any]:
    """What the Stop (run page) and Cancel (queue page) buttons ask, and from when (epoch
    seconds): the page's script asks with window.confirm once that moment has passed."""
    minutes = LONG_RUN_SECONDS // 60
    if queued:
        text = (
            f"Cancel “{name}”? It has waited in the queue for {minutes} minutes or "
            "more and loses its place."
        )
    else:
        text = (
            f"End “{name}”? It was launched {minutes} minutes or more ago: what it "
            "has trained stays on its page, but it can go on only from a checkpoint."
        )
    return {"text": text, "from": launched_at + LONG_RUN_SECONDS}


def runs_ahead_text(count: int) -> str:
    """What a queued run's owner is told of the runs ahead of it: how many, nothing of whose."""
    if count == 0:
        return "next in line"
    return f"{count} run{'' if count == 1 else 's'} ahead"


def queue_start_text(seconds: float | None) -> str:
    """A queued run's estimated start, as the queue page shows it."""
    if seconds is None:
        return "unknown"
    if seconds < 1:
        return "now"
    return f"in about {format_duration(seconds)}"


QUEUE_NOT_TRIED = "not tried yet: a worker will look at it in a moment"


def queue_summary_text(*, total: int, shown: int, everyone: bool) -> str:
    queued = f"{total} run{'' if total == 1 else 's'} queued"
    if everyone or shown == total:
        return f"{queued}."
    return f"{queued} in all; {shown} of them yours (only yours are shown)."
