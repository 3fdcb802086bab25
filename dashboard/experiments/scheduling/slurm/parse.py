"""What the Slurm commands print, read into small dataclasses: no Django, no subprocess.

Only the forms that stay put across releases are read (PITFALLS.md): `squeue -h -o
'%i|%j|%T|%r'`, `sinfo -h -o` with chosen fields, and `scontrol show node -o` as key=value
pairs. `squeue --json` and slurmrestd change their schema nearly every release; these do not.
tests/test_slurm_parse.py holds output recorded from 22.05 and from a newer release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The job states of squeue's %T whose job is over; the others (PENDING, RUNNING, CONFIGURING,
# COMPLETING, SUSPENDED, REQUEUED, REQUEUE_HOLD, RESIZING, ...) still hold or wait for nodes.
ENDED_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
     "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"}
)  # fmt: skip
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SUSPENDED"})
# squeue's reason for a job that waits for nothing (a running or ended one).
NO_REASON = "None"

# The fields the squeue and sinfo calls ask for: the parsers below read exactly these.
SQUEUE_FORMAT = "%i|%j|%T|%r"
SINFO_FORMAT = "%R|%a|%l|%D|%c|%G|%P"


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    name: str
    state: str  # PENDING, RUNNING, ... (squeue's %T)
    reason: str  # Resources, Priority, QOSMaxJobsPerUserLimit, ...; "" for none

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES


def squeue_parse(text: str) -> list[SlurmJob]:
    """`squeue -h -o '%i|%j|%T|%r'`: a job a line (a job name may hold a '|': the id, state and
    reason never do). A heterogeneous job is listed a component a line, `123+0`, `123+1`: it is
    the one job sbatch answered `123` for, said once, by its first component. An array's task
    (`123_4`, `123_[5-9]` while pending) keeps its own id: sbatch answered the array's."""
    jobs = []
    for line in text.splitlines():
        if line.count("|") < 3:
            continue
        job_id, rest = line.split("|", 1)
        job_id, plus, component = job_id.strip().partition("+")
        if plus and component != "0":
            continue
        name, state, reason = rest.rsplit("|", 2)
        reason = "" if reason.strip() == NO_REASON else reason.strip()
        jobs.append(SlurmJob(job_id, name, state.strip(), reason))
    return jobs


@dataclass(frozen=True)
class Partition:
    name: str
    up: bool
    nodes: int
    cpus_per_node: int  # the most any of its nodes has
    gpus_per_node: int  # likewise
    max_minutes: int | None  # None: no limit
    default: bool = False  # the one a job goes to when it names none

    def describe(self) -> str:
        gpus = f", {self.gpus_per_node} GPU(s)" if self.gpus_per_node else ""
        limit = f", {self.max_minutes} min at most" if self.max_minutes is not None else ""
        return f"{self.name}: {self.nodes} node(s) of {self.cpus_per_node} CPU(s){gpus}{limit}"


def sinfo_parse(text: str) -> list[Partition]:
    """`sinfo -h -o '%R|%a|%l|%D|%c|%G|%P'`: a line per partition and kind of node in it (nodes
    alike are one line), added up per partition in the order sinfo lists them; %P is the name
    with a '*' on the default partition."""
    found: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 7:
            continue
        name, available, limit, count, cpus, gres, marked = (f.strip() for f in fields)
        seen = found.get(name)
        part = Partition(
            name=name,
            up=available == "up",
            nodes=_leading_int(count),
            cpus_per_node=_leading_int(cpus),
            gpus_per_node=gres_gpus(gres),
            max_minutes=time_minutes(limit),
            default=marked.endswith("*"),
        )
        if seen is not None:
            part = Partition(
                name=name,
                up=seen.up or part.up,
                nodes=seen.nodes + part.nodes,
                cpus_per_node=max(seen.cpus_per_node, part.cpus_per_node),
                gpus_per_node=max(seen.gpus_per_node, part.gpus_per_node),
                max_minutes=seen.max_minutes,
                default=seen.default,
            )
        found[name] = part
    return list(found.values())


def _leading_int(text: str) -> int:
    """sinfo's counts: "4", or "2+" where its nodes differ (the least of them)."""
    digits = re.match(r"\d+", text)
    return int(digits.group()) if digits else 0


def gres_gpus(text: str) -> int:
    """The GPUs a node's gres says: "gpu:4" (22.05), "gpu:a100:4(S:0-1)" (typed, with sockets,
    from 23.02 on), several kinds comma-separated; "(null)" or "" is none."""
    total = 0
    for item in re.split(r",(?![^(]*\))", text):
        kind = item.split("(", 1)[0].split(":")
        if kind[0] == "gpu" and len(kind) >= 2 and kind[-1].isdigit():
            total += int(kind[-1])
    return total


def time_minutes(text: str) -> int | None:
    """A Slurm time ("infinite", "UNLIMITED", "30:00", "2:00:00", "1-12:00:00", "45") in whole
    minutes, rounded up; None for no limit."""
    text = text.strip()
    if not text or text.lower() in ("infinite", "unlimited", "n/a"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    # Slurm's forms: M, M:S, H:M:S; after days D-H, D-H:M, D-H:M:S.
    units = (3600, 60, 1) if days else {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(parts)]
    seconds = sum(part * unit for part, unit in zip(parts, units, strict=False))
    seconds += int(days or 0) * 86400
    return -(-seconds // 60)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str  # NodeAddr: node names need not resolve (PITFALLS.md)
    cpus: int
    gpus: int
    state: str  # IDLE, MIXED, ALLOCATED, DOWN+NOT_RESPONDING, ...
    hostname: str = ""  # NodeHostName: what its processes call their host


# A key of `scontrol show node -o`: a word (with ':' or '/' in a few) right before '='.
_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


def scontrol_pairs(line: str) -> dict[str, str]:
    """One record of `scontrol show ... -o` as its key=value pairs; a value may hold spaces
    (OS=Linux 6.1.0 #1 SMP, a Reason with its author), so it runs to the next key."""
    keys = list(_KEY.finditer(line))
    pairs = {}
    for index, key in enumerate(keys):
        end = keys[index + 1].start() if index + 1 < len(keys) else len(line)
        pairs[key.group(1)] = line[key.end() : end].strip()
    return pairs


def scontrol_nodes_parse(text: str) -> list[SlurmNode]:
    """`scontrol show node -o [NODES]`: a node a line."""
    nodes = []
    for line in text.splitlines():
        pairs = scontrol_pairs(line)
        if "NodeName" not in pairs:
            continue
        nodes.append(
            SlurmNode(
                name=pairs["NodeName"],
                address=pairs.get("NodeAddr") or pairs["NodeName"],
                cpus=_leading_int(pairs.get("CPUTot", "")),
                gpus=gres_gpus(pairs.get("Gres", "")),
                state=pairs.get("State", ""),
                hostname=pairs.get("NodeHostName", ""),
            )
        )
    return nodes
