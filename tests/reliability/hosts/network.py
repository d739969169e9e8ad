"""Hosts on one machine: network namespaces on a bridge, and the faults between them.

Every name starts with :data:`PREFIX`, every address is in :data:`SUBNET` (a
private /24 used for nothing else): the bridge holds the root namespace's
address, each namespace one veth pair into the bridge. :func:`topology`
removes whatever an earlier, crashed run left behind, builds the hosts, and
removes everything again on the way out, however it is left. A file lock
keeps two runs on one machine from tearing down each other's hosts.

The faults: :meth:`Host.cut_from` drops (``iptables -j DROP``, inside the
host's namespace) every packet between the host and another host, so it is
cut off from that host alone; :meth:`Host.unplug` sets the bridge's end of the
host's veth down, a silent partition (packets vanish, like a pulled cable,
rather than failing at once).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "pkh-"
SUBNET = ipaddress.ip_network("10.213.7.0/24")
BRIDGE = f"{PREFIX}br"
BRIDGE_ADDRESS = str(SUBNET.network_address + 1)
LOCK = Path("/run/lock/pikku-fault-hosts.lock")


class NamespacesRefused(RuntimeError):
    """The kernel (or the lack of privileges) does not let this process make namespaces."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


def _must(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, done.args))}: {done.stderr.strip()}")


def _in_subnet(address: str) -> str:
    if ipaddress.ip_address(address) not in SUBNET:
        raise ValueError(f"{address} is outside {SUBNET}: the fault hosts use no other address")
    return address


@dataclass
class Host:
    """A network namespace with one address on the bridge."""

    name: str  # the namespace, PREFIX + a short name
    address: str
    cuts: set[str] = field(default_factory=set)

    @property
    def outer_link(self) -> str:
        """The veth end in the root namespace, a port of the bridge."""
        return f"{self.name}-h"

    @property
    def inner_link(self) -> str:
        return f"{self.name}-n"

    @property
    def exec_prefix(self) -> list[str]:
        """What a command runs under to run on this host."""
        return ["ip", "netns", "exec", self.name]

    def create(self) -> None:
        _must(_ip("netns", "add", self.name))
        veth = ["type", "veth", "peer", "name", self.inner_link, "netns", self.name]
        _must(_ip("link", "add", self.outer_link, *veth))
        _must(_ip("link", "set", self.outer_link, "master", BRIDGE, "up"))
        cidr = f"{self.address}/{SUBNET.prefixlen}"
        _must(_ip("-n", self.name, "addr", "add", cidr, "dev", self.inner_link))
        _must(_ip("-n", self.name, "link", "set", self.inner_link, "up"))
        _must(_ip("-n", self.name, "link", "set", "lo", "up"))

    def run(self, argv: Sequence[str]) -> None:
        """Run ``argv`` on this host; an error if it fails."""
        done = subprocess.run(
            [*self.exec_prefix, *argv], capture_output=True, text=True, timeout=30, check=False
        )
        _must(done)

    def cut_from(self, other: Host) -> None:
        """Drop every packet between this host and ``other``, both ways."""
        target = _in_subnet(other.address)
        for rule in _cut_rules(target):
            self.run([_iptables(), "-I", *rule])
        self.cuts.add(target)

    def heal(self) -> None:
        """Remove every cut this host has."""
        for target in sorted(self.cuts):
            for rule in _cut_rules(target):
                self.run([_iptables(), "-D", *rule])
        self.cuts.clear()

    def unplug(self) -> None:
        """Set the bridge's end of this host's link down: a silent partition."""
        _must(_ip("link", "set", self.outer_link, "down"))

    def plug(self) -> None:
        """Set the link up again, back on the bridge."""
        _must(_ip("link", "set", self.outer_link, "master", BRIDGE, "up"))


def _cut_rules(address: str) -> list[list[str]]:
    return [["OUTPUT", "-d", address, "-j", "DROP"], ["INPUT", "-s", address, "-j", "DROP"]]


def _iptables() -> str:
    found = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
    if found is None:
        raise NamespacesRefused("iptables is not installed (apt-get install iptables)")
    return found


def leftovers() -> list[str]:
    """Namespaces and links of this suite that exist now."""
    names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in _ip("-o", "link", "show").stdout.splitlines()
        if ":" in line
    ]
    return [n for n in names + links if n.startswith(PREFIX)]


def clean_up() -> None:
    """Remove every namespace and link named with :data:`PREFIX` (a veth pair
    goes with its namespace)."""
    for name in _ip("netns", "list").stdout.split():
        if name.startswith(PREFIX):
            _ip("netns", "del", name)
    for name in leftovers():
        _ip("link", "del", name)


def check_allowed() -> None:
    """Raise :class:`NamespacesRefused` if this process cannot make a namespace."""
    if shutil.which("ip") is None:
        raise NamespacesRefused("the ip command (iproute2) is not installed")
    _iptables()
    probe = f"{PREFIX}probe"
    _ip("netns", "del", probe)
    done = _ip("netns", "add", probe)
    _ip("netns", "del", probe)
    if done.returncode != 0:
        raise NamespacesRefused(f"ip netns add refused: {done.stderr.strip()}")


@contextlib.contextmanager
def topology(names: Sequence[str]) -> Iterator[dict[str, Host]]:
    """The bridge and one host per name (addresses in order from ``.2``)."""
    check_allowed()
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run of the suite at a time on a machine
        clean_up()
        hosts = {
            short: Host(f"{PREFIX}{short}", str(SUBNET.network_address + 2 + i))
            for i, short in enumerate(names)
        }
        try:
            _must(_ip("link", "add", BRIDGE, "type", "bridge"))
            _must(_ip("addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE))
            _must(_ip("link", "set", BRIDGE, "up"))
            for host in hosts.values():
                host.create()
            yield hosts
        finally:
            clean_up()
