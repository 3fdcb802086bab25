"""Several machines on one host for tests: Linux network namespaces with addresses of their own.

Each machine is a namespace with one veth link into a bridge in the root namespace; the bridge
holds the host's address on that network, so servers the test starts in the root namespace
(Redis, PostgreSQL, daphne) are reached from every machine at `network.host_address`. Only
addresses of the 198.18.0.0/15 benchmarking range (RFC 2544) are used, a /24 of it per test run,
and everything is deleted afterwards. Needs root (CI runs as root); `namespaces_unavailable()`
says why not where it cannot.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def namespaces_unavailable() -> str | None:
    """Why this host cannot make test machines, or None when it can."""
    if shutil.which("ip") is None:
        return "the ip command (Debian's iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    probe = f"typrobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Machine:
    name: str  # the namespace, also the machine's name
    address: str
    host_link: str  # the veth end in the root namespace: set it down to cut the machine off

    def command(self, args: list[str]) -> list[str]:
        """`args` as run on this machine."""
        return ["ip", "netns", "exec", self.name, *args]

    def run(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.command(args), check=False, **kwargs)

    def popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(args), **kwargs)  # noqa: S603

    def can_reach(self, address: str, port: int) -> bool:
        """Whether a TCP connection from this machine to address:port opens within 2 s."""
        probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=2)"
        return self.run(["/usr/bin/python3", "-c", probe], timeout=20).returncode == 0

    def link_set(self, *, up: bool) -> None:
        """Cut the machine off the network (or reconnect it), as a pulled cable would."""
        _ip("link", "set", self.host_link, "up" if up else "down")

    def pids(self) -> set[int]:
        """Every process whose network namespace is this machine's."""
        listed = _ip("netns", "pids", self.name, check=False).stdout.split()
        return {int(pid) for pid in listed}


@dataclass
class Network:
    bridge: str
    host_address: str
    machines: list[Machine] = field(default_factory=list)


def _subnet() -> int:
    """A /24 of 198.18.0.0/16 that no other interface on this host uses."""
    used = _ip("-4", "-o", "addr", "show").stdout
    for offset in range(250):
        third = (os.getpid() + offset) % 250 + 1
        if f"198.18.{third}." not in used:
            return third
    raise RuntimeError("no free /24 left in 198.18.0.0/16")


# One file for every checkout on the host: the 198.18.0.0/16 they choose from is the host's.
SUBNET_LOCK = "/tmp/trainyard-netns.lock"  # noqa: S108


@contextlib.contextmanager
def subnet_lock() -> Iterator[None]:
    """Held from choosing a /24 until the bridge holds its address, so that two test processes
    (xdist workers, two checkouts) that start a network at once never choose the same one."""
    with open(SUBNET_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _machine_add(network: Network, *, tag: str, index: int, subnet: int) -> Machine:
    name, host_link = f"{tag}m{index}", f"{tag}v{index}"
    address = f"198.18.{subnet}.{10 + index}"
    _ip("netns", "add", name)
    machine = Machine(name=name, address=address, host_link=host_link)
    # Known to the teardown from here on: a step that fails below must not leak the namespace.
    network.machines.append(machine)
    _ip("link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", name)
    _ip("link", "set", host_link, "master", network.bridge, "up")
    for args in (
        ("addr", "add", f"{address}/24", "dev", "eth0"),
        ("link", "set", "eth0", "up"),
        ("link", "set", "lo", "up"),
        ("route", "add", "default", "via", network.host_address),
    ):
        _ip("-n", name, *args)
    return machine


# Each network of one test process gets its own names: a namespace the kernel keeps a moment
# after its teardown (a process still leaving it) must not collide with the next module's.
_networks = itertools.count()


@contextlib.contextmanager
def machines(count: int) -> Iterator[Network]:
    """`count` machines on one bridge; every namespace, link and process in them ends after."""
    # The whole process id (at most 7 digits: pid_max is 2**22), unique among the processes alive;
    # with "br" the bridge's name is 14 characters, one under the kernel's limit.
    tag = f"ty{os.getpid()}n{next(_networks) % 100}"
    network = Network(bridge=f"{tag}br", host_address="")
    try:
        with subnet_lock():
            subnet = _subnet()
            network.host_address = f"198.18.{subnet}.1"
            # No forwarding delay: a machine whose link comes back up is reachable at once.
            _ip("link", "add", network.bridge, "type", "bridge", "forward_delay", "0")
            _ip("addr", "add", f"{network.host_address}/24", "dev", network.bridge)
        _ip("link", "set", network.bridge, "up")
        for index in range(count):
            _machine_add(network, tag=tag, index=index, subnet=subnet)
        with contextlib.suppress(OSError):  # /etc read-only: the machines work, only slower
            _names_write(network)
        yield network
    finally:
        _teardown(network)


# `ip netns exec NAME` mounts the files of /etc/netns/NAME over /etc's.
NETNS_ETC = "/etc/netns"
# No name server on the test network: a query fails at once (nothing listens on the machine's
# own port 53) instead of waiting out the host's resolver, which a machine cannot reach. The
# reverse lookup of each peer that c10d's store makes timed out twice at every torchrun start,
# 11 s each time.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def _names_write(network: Network) -> None:
    """Each machine knows the others by name, as machines on one network would (from DNS on a
    real one): the host's /etc/hosts, plus the host's and every machine's address."""
    with open("/etc/hosts") as f:
        hosts = f.read().rstrip("\n") + "\n"
    hosts += f"{network.host_address} {network.bridge}\n"
    hosts += "".join(f"{m.address} {m.name}\n" for m in network.machines)
    for machine in network.machines:
        folder = os.path.join(NETNS_ETC, machine.name)
        os.makedirs(folder, exist_ok=True)
        for name, text in (("hosts", hosts), ("resolv.conf", RESOLV_CONF)):
            with open(os.path.join(folder, name), "w") as f:
                f.write(text)


def _teardown(network: Network) -> None:
    for machine in network.machines:
        shutil.rmtree(os.path.join(NETNS_ETC, machine.name), ignore_errors=True)
        for pid in machine.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        _ip("netns", "del", machine.name, check=False)
        _ip("link", "del", machine.host_link, check=False)  # gone with the namespace, else here
    _ip("link", "del", network.bridge, check=False)
