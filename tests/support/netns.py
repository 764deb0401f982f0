"""A network namespace joined to this host by a veth pair, whose link a test can cut.

A process started with `Namespace.exec_prefix` reaches this host only at `host_address`, over
the veth. `cut()` takes the host's end of the link down: the namespace's packets then vanish
without a reset or an ICMP error, as on a partitioned network, and the host's answers are
dropped by a blackhole route; `heal()` brings the link back, and open TCP connections resume
if neither side has given up on them.

    with Namespace.create() as ns:
        subprocess.run([*ns.exec_prefix, "ping", "-c1", ns.host_address])

What this does not do: it does not delay or lose a share of the packets (the kernel may lack
netem); it is all or nothing.
"""

from __future__ import annotations

import os
import random
import subprocess
import uuid
from types import TracebackType


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable_reason() -> str | None:
    """Why a namespace cannot be made here (not root, no `ip`, no netns support), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"dwprobe{uuid.uuid4().hex[:6]}"
    try:
        probe = _ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "the `ip` program (iproute2) is not installed"
    if probe.returncode != 0:
        return f"`ip netns add` failed: {probe.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Namespace:
    """One namespace and its veth pair, on a /30 of its own; see the module's docs."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"dw{tag}"
        self.host_if = f"dwh{tag}"
        self.ns_if = f"dwn{tag}"
        net = random.randrange(0, 1 << 14) << 2  # a /30 within 10.200.0.0/16
        base = f"10.200.{net >> 8}"
        self.subnet = f"{base}.{net & 0xFF}/30"
        self.host_address = f"{base}.{(net & 0xFF) + 1}"
        self.ns_address = f"{base}.{(net & 0xFF) + 2}"
        self.exec_prefix = ("ip", "netns", "exec", self.name)

    @classmethod
    def create(cls) -> Namespace:
        ns = cls()
        try:
            _ip("netns", "add", ns.name)
            _ip("link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if)
            _ip("link", "set", ns.ns_if, "netns", ns.name)
            _ip("addr", "add", f"{ns.host_address}/30", "dev", ns.host_if)
            _ip("link", "set", ns.host_if, "up")
            # While the link is cut, the host's packets to the namespace go nowhere, not out
            # of the host's default route.
            _ip("route", "add", "blackhole", ns.subnet, "metric", "1000")
            _ip("-n", ns.name, "addr", "add", f"{ns.ns_address}/30", "dev", ns.ns_if)
            _ip("-n", ns.name, "link", "set", ns.ns_if, "up")
            _ip("-n", ns.name, "link", "set", "lo", "up")
        except BaseException:
            ns.destroy()
            raise
        return ns

    def cut(self) -> None:
        """Drop every packet between the namespace and the host, silently."""
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        """Carry packets again."""
        _ip("link", "set", self.host_if, "up")

    def destroy(self) -> None:
        _ip("route", "del", "blackhole", self.subnet, "metric", "1000", check=False)
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.name, check=False)

    def __enter__(self) -> Namespace:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()
