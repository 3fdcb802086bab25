"""Every sentence the study pages and the API show about studies: one home, so that the form,
the page and the JSON say the same thing."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, cast

from dashboard.experiments.core.forms import FORM_STRATEGIES
from dashboard.experiments.core.memory import SUMMARY_FIGURES, memory_summary_texts
from dashboard.experiments.metrics.language import TABLE_FIGURES, table_texts
from dashboard.experiments.metrics.phases import RunShares, efficiency_reason_text, shares_text
from dashboard.studies.models import BatchMode
from dashboard.texts import words_joined
from training.registry import REGISTRY

MAX_RUNS = 48
# The table shows seconds to target in tenths: two cells it shows alike are a tie (fastest.py).
SECONDS_DECIMALS = 1
BATCH_MODE_HELP = {
    BatchMode.PER_PROCESS: (
        "Every process trains on the batch size below, so N processes take N times the images "
        "per step: more throughput, but fewer optimizer steps an epoch than the single run."
    ),
    BatchMode.GLOBAL: (
        "The batch size below is split over each run's processes, so every run takes the same "
        "images per optimizer step: the fair comparison of strategies (it must divide evenly)."
    ),
}
TIME_TO_TARGET_RULE = (
    "Time to target: seconds from a run's start (and images seen) until the end of the first "
    "epoch whose test accuracy reached the target, from the stored epoch points; a cell's figure "
    "is the mean over its seeds, and only once every one of its runs has reached the target."
)
SPEEDUP_RULE = (
    "Speedup: the cell's images/s ÷ the images/s of the study's single-device cell with the same "
    "batch size, learning rate and optimizer (else the study's only single cell). "
    "Efficiency: speedup ÷ world size (processes × nodes for process strategies)."
)
ACCURACY_RULE = "Final accuracy: the mean of the succeeded runs' last test accuracy, ± their "
ACCURACY_RULE += "standard deviation over seeds."
MEMORY_CELL_RULE = (
    "Memory per rank: the rank that holds the most at its run's last epoch, over the cell's runs, "
    "and the highest peak."
)
# The strategies a study offers (the launch form's), by whether they take a process count: the
# registry's, so that a strategy added there is named here (the help said "For DDP, Hogwild and
# DeepSpeed" while nine took one).
_OFFERED = [spec for spec in REGISTRY if spec.name in FORM_STRATEGIES]
PRESET_HELP = (
    "A scaling study: every chosen strategy at every process count, each with every seed. "
    "Strategies that run one process "
    f"({words_joined([spec.short for spec in _OFFERED if not spec.processes])}) run once per seed."
)
PROCESS_COUNTS_HELP = (
    f"For {words_joined([spec.short for spec in _OFFERED if spec.processes])}, e.g. 2, 4."
)
# The default target, one the default epoch reaches: the default CNN is at 94% after one epoch
# on the MNIST sample, 97% after four (measured on 2 cores).
TARGET_DEFAULT = 0.9
TARGET_HELP = (
    f"A fraction, e.g. {TARGET_DEFAULT}: the table times each cell to it. Pick one the epochs "
    "can reach: the default CNN is at about 0.94 after one epoch of the MNIST sample, 0.97 "
    "after four."
)
MODEL_HELP = "What the online workers have (the Devices page lists them)."
AXES_HELP = (
    "Values separated by commas; the runs are every combination of the filled-in axes "
    f"(at most {MAX_RUNS}). An axis left empty takes the value above, or a new run's default "
    "(DDP, its natural process count, one node, seed 1)."
)
STOP_AT_TARGET_HELP = (
    "Each run ends after the first epoch whose test accuracy reaches the target: the table's "
    "time to target stays the same and the study finishes sooner."
)


SKIPPED_RULE = (
    "Skipped cells: a cell that sets an option its strategy does not read (to a value other "
    "than the option's default) is not run, as a launch of it would be refused; the rest of the "
    "study runs."
)


def all_skipped_text(cells: int) -> str:
    return f"every cell ({cells}) sets an option its strategy does not read; nothing was created"


def runs_text(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"


def reached_text(*, reached: int, runs: int, finished: int, target: float, resumed: int = 0) -> str:
    """What a cell's time-to-target column says when it has no figure, or how many reached."""
    if resumed:
        runs_text = "a run" if resumed == 1 else f"{resumed} runs"
        return (
            f"{reached} of {runs} reached {target:.0%}; no time: {runs_text} resumed after a "
            f"lost attempt, whose clock restarted"
        )
    if reached == runs:
        return f"all {runs} reached {target:.0%}" if runs > 1 else f"reached {target:.0%}"
    if finished < runs:
        return f"{reached} of {runs} reached {target:.0%} so far"
    if reached == 0:
        return f"never reached {target:.0%}"
    return f"only {reached} of {runs} reached {target:.0%}"


def seconds_text(seconds: float) -> str:
    return f"{seconds:.{SECONDS_DECIMALS}f} s"


def cells_text(count: int) -> str:
    return f"{count} cell{'' if count == 1 else 's'}"


def fastest_text(*, fastest: Mapping[str, Any] | None, target: float, final: bool) -> str:
    """The study's answer above its table: "Fastest to 80%: ddp, comm_hook fp16, 41.0 s (1.30×
    faster than fsdp); 1 cell did not reach it." `fastest` is fastest.py's (None while no cell
    has a time to target); "so far" and the cells not finished say what could still change it."""
    if fastest is None:
        if final:
            return f"No cell reached {target:.0%}."
        return f"No cell has reached {target:.0%} yet."
    parts = [f"Fastest to {target:.0%}{'' if final else ' so far'}: {_winner_text(fastest)}"]
    if fastest["not_reached"]:
        parts.append(f"{cells_text(fastest['not_reached'])} did not reach it")
    if fastest["pending"]:
        parts.append(f"{cells_text(fastest['pending'])} not finished yet")
    return "; ".join(parts) + "."


def _winner_text(fastest: Mapping[str, Any]) -> str:
    seconds = seconds_text(fastest["time_to_target_seconds"])
    if fastest["tied"]:
        others = " and ".join(other["label"] for other in fastest["tied"])
        return f"{fastest['label']}, tied with {others} at {seconds}"
    if fastest["ratio"] is not None:
        faster = f"{fastest['ratio']:.2f}× faster than {fastest['next']['label']}"
        return f"{fastest['label']}, {seconds} ({faster})"
    return f"{fastest['label']}, {seconds}"


def cell_settings_text(config: Mapping[str, Any]) -> str:
    """What a cell trains with beside its strategy: the engine's batch size, learning rate and
    optimizer, or a script's command line (its args axes' pairs last), as a shell writes it."""
    if config["entrypoint"]:
        return shlex.join([config["entrypoint"], *config["args"]])
    settings = f"bs {config['batch_size']} · lr {config['lr']} · {config['optimizer']}"
    if config.get("model_size"):  # a language model's size and window
        settings = f"{config['model_size']} · window {config['seq_len']} · {settings}"
    return settings


def cell_texts(cell: dict[str, object]) -> dict[str, str]:
    """A cell's figures as the study page shows them (the page's script places these as they
    are: it formats nothing itself)."""
    seconds, images = cell["time_to_target_seconds"], cell["images_to_target"]
    mean, std = cell["final_accuracy_mean"], cell["final_accuracy_std"]
    ips, speedup, efficiency = cell["images_per_second"], cell["speedup"], cell["efficiency"]
    accuracy = f"{mean:.2%}" if isinstance(mean, float) else "—"
    if isinstance(std, float):
        accuracy += f" ± {std:.2%}"
    # The cell's memory_* figures (cells.py), in core/memory.py's words.
    memory: dict[str, Any] = {name: cell[f"memory_{name}"] for name in SUMMARY_FIGURES}
    shares = cast(RunShares | None, cell["phase_shares"])
    reason = efficiency_reason_text(
        efficiency=efficiency if isinstance(efficiency, float) else None, shares=shares
    )
    return {
        **{f"memory_{line}": text for line, text in memory_summary_texts(**memory).items()},
        "settings": cell_settings_text(cast(Mapping[str, Any], cell["config"])),
        "time_to_target": seconds_text(seconds) if isinstance(seconds, float) else "—",
        "images_to_target": f"{images:,.0f} images" if isinstance(images, float) else "",
        "reached": str(cell["reached_text"]),
        "final_accuracy": accuracy,
        "images_per_second": f"{ips:,.0f} img/s" if isinstance(ips, float) else "—",
        "speedup": f"{speedup:.2f}×" if isinstance(speedup, float) else "—",
        "efficiency": f"{efficiency:.0%}" if isinstance(efficiency, float) else "—",
        "phase_shares": shares_text(shares),
        "efficiency_reason": reason or "",
        # A language model's tokens/s, MFU and bits per byte ("" for a classifier's cell).
        **table_texts(
            {name: cell[name] for name in TABLE_FIGURES} if cell.get("language") else None
        ),
    }
