"""A point-to-point IP link between two of the rig's namespaces that runs through this process: a userspace netem.

This kernel has no netem qdisc, and a TCP proxy (lossy_proxy.py) carries only the connections dialled at it, while
a split model's ranks dial each other at addresses and ports drawn at placement. This link carries every packet
between the two namespaces instead: each namespace gets a TUN device (`hop0`) holding its own address, with the
other's as its point-to-point peer, and two threads here copy each packet from one device to the other
`delay_s` later (a one-way delay, so a round trip gains twice it). The delay can be changed while nodes run; a
bandwidth limit is `tc ... tbf` on a namespace's `hop0`, as on any interface.
"""

import contextlib
import fcntl
import heapq
import os
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field

from tests.cluster.netns_rig import enter_namespace

DEVICE = "hop0"
# Large packets: fewer of them for this process to copy (a model's files cross the link too).
MTU = 16000
_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000


def _open_tun(namespace: str) -> int:
    """A TUN device named DEVICE created inside `namespace` (a device is born in its creator's namespace)."""
    opened: list[int] = []

    def create() -> None:
        enter_namespace(namespace)
        descriptor = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(descriptor, _TUNSETIFF, struct.pack("16sH", DEVICE.encode(), _IFF_TUN | _IFF_NO_PI))
        opened.append(descriptor)

    thread = threading.Thread(target=create)
    thread.start()
    thread.join()
    if not opened:
        raise RuntimeError(f"could not create a TUN device in {namespace}")
    return opened[0]


@dataclass
class TunLink:
    namespace_a: str
    address_a: str
    namespace_b: str
    address_b: str
    delay_s: float = 0.0
    packets: int = 0
    _descriptors: list[int] = field(default_factory=list[int])
    _closing: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        ends = ((self.namespace_a, self.address_a, self.address_b), (self.namespace_b, self.address_b, self.address_a))
        for namespace, own, peer in ends:
            self._descriptors.append(_open_tun(namespace))
            ip = ["ip", "-n", namespace]
            subprocess.run([*ip, "addr", "add", own, "peer", peer, "dev", DEVICE], check=True, capture_output=True)
            subprocess.run([*ip, "link", "set", DEVICE, "mtu", str(MTU), "up"], check=True, capture_output=True)
        a, b = self._descriptors
        for source, sink in ((a, b), (b, a)):
            threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        for descriptor in self._descriptors:
            with contextlib.suppress(OSError):
                os.close(descriptor)

    def _relay(self, source: int, sink: int) -> None:
        """Read packets from `source`; write each to `sink` once its delay has passed (in order: the delay is the
        same for all, and changing it never reorders what is already queued)."""
        queued: list[tuple[float, int, bytes]] = []
        arrived = threading.Condition()
        sequence = 0

        def write() -> None:
            while not self._closing.is_set():
                with arrived:
                    while not queued and not self._closing.is_set():
                        arrived.wait(0.5)
                    if not queued:
                        continue
                    due, _, packet = queued[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        arrived.wait(wait)
                        continue
                    heapq.heappop(queued)
                try:
                    os.write(sink, packet)
                except OSError:
                    if self._closing.is_set():
                        return

        threading.Thread(target=write, daemon=True).start()
        last_due = 0.0
        while not self._closing.is_set():
            try:
                packet = os.read(source, MTU + 64)
            except OSError:
                return
            self.packets += 1
            last_due = max(last_due, time.monotonic() + self.delay_s)
            with arrived:
                sequence += 1
                heapq.heappush(queued, (last_due, sequence, packet))
                arrived.notify()
