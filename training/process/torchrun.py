"""torchrun's flags for where a run's ranks meet, and the network interface they use: the
engine's torchrun (training.cli) and a script's (training.scripts) start the same way."""

from __future__ import annotations

import logging

from training.config import TrainConfig
from training.protocol import RANK_OUTPUT_TEMPLATE

log = logging.getLogger("training")


def torchrun_rendezvous(cfg: TrainConfig) -> list[str]:
    """torchrun's flags for where the ranks meet: --standalone on one machine; on several, the
    c10d rendezvous hosted on the first machine's store.

    torchrun decides whether it hosts the store by matching the endpoint against its host name,
    which machines in containers or network namespaces may share: is_host says it outright. Its
    node descriptor (and the master address the ranks connect to) is --local-addr, else the host
    name, which such machines cannot tell apart either. torchrun's own restarts stay off
    (--max-restarts 0): a failed node ends this attempt, and the dashboard resumes the run from
    its newest checkpoint on machines that are free (docs/guides/several-machines.md).
    """
    if cfg.nnodes <= 1:
        return ["--standalone"]
    assert cfg.rdzv_endpoint is not None and cfg.rdzv_id is not None
    flags = [
        f"--nnodes={cfg.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        f"--rdzv-id={cfg.rdzv_id}",
        f"--rdzv-conf=is_host={str(cfg.rdzv_host).lower()}",
        "--max-restarts=0",
    ]
    if cfg.local_addr:
        flags.append(f"--local-addr={cfg.local_addr}")
    return flags


def torchrun_rank_output(*, streams: int) -> list[str]:
    """torchrun's flags that put each rank's ``streams`` (2: stderr, 3: stdout and stderr, as
    its --tee reads them) on its own, each line after the rank's prefix (protocol.py's
    RANK_OUTPUT_TEMPLATE). Without them the ranks' lines come mixed, no watcher can tell whose a
    line is, and only lines that say their rank (the marked log lines) are kept as a rank's.
    torchrun writes each rank's to a file of its log folder and tails it (0.1 s apart)."""
    return [f"--tee={streams}", f"--log-line-prefix-template={RANK_OUTPUT_TEMPLATE}"]


def socket_interfaces_set(env: dict[str, str], address: str | None) -> None:
    """Point Gloo and NCCL at the interface that holds --local-addr, unless the user chose one.

    Left alone, Gloo binds to the address the host name resolves to, which on a machine with
    several networks (or in a network namespace) is not the one the other machines reach.
    """
    if not address:
        return
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            env.setdefault("GLOO_SOCKET_IFNAME", name)
            env.setdefault("NCCL_SOCKET_IFNAME", name)
            return
    log.warning("no interface here has --local-addr %s; Gloo picks its own", address)
