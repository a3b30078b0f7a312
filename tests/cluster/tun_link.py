"""An IP link between some of the rig's namespaces that runs through this process: a userspace netem.

This kernel has no netem qdisc, and a TCP proxy (lossy_proxy.py) carries only the connections dialled at it, while
a split model's ranks dial each other at addresses and ports drawn at placement. This link carries every packet
between the namespaces instead: each namespace gets a TUN device (`hop0`) holding its own address in one /24, and
this process reads each packet a namespace sends, and writes it to the device of the namespace holding its
destination address `delay_s` later (a one-way delay, so a round trip gains twice it). It is a switch with a
delay, for two namespaces or more. The delay can be changed while nodes run; a bandwidth limit is
`tc ... tbf` on a namespace's `hop0`, as on any interface. With `record`, every packet is kept (`recorded`) for a
test to read what crossed the link.
"""

import contextlib
import fcntl
import heapq
import os
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
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


def _destination(packet: bytes) -> bytes:
    """The IPv4 destination address of `packet` (empty for anything else)."""
    return packet[16:20] if len(packet) >= 20 and packet[0] >> 4 == 4 else b""


@dataclass
class _Port:
    """One namespace's end of the link: its TUN device, and the packets waiting out their delay towards it."""

    descriptor: int
    queued: list[tuple[float, int, bytes]] = field(default_factory=list[tuple[float, int, bytes]])
    arrived: threading.Condition = field(default_factory=threading.Condition)
    last_due: float = 0.0


@dataclass
class TunLink:
    ends: Sequence[tuple[str, str]]
    """(namespace, IPv4 address) of each namespace on the link; the addresses share one /24."""
    delay_s: float = 0.0
    record: bool = False
    packets: int = 0
    recorded: list[bytes] = field(default_factory=list[bytes])
    _ports: dict[bytes, _Port] = field(default_factory=dict[bytes, _Port])
    _sequence: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        for namespace, address in self.ends:
            descriptor = _open_tun(namespace)
            self._ports[bytes(int(part) for part in address.split("."))] = _Port(descriptor)
            ip = ["ip", "-n", namespace]
            subprocess.run([*ip, "addr", "add", f"{address}/24", "dev", DEVICE], check=True, capture_output=True)
            subprocess.run([*ip, "link", "set", DEVICE, "mtu", str(MTU), "up"], check=True, capture_output=True)
        for port in self._ports.values():
            threading.Thread(target=self._read, args=(port.descriptor,), daemon=True).start()
            threading.Thread(target=self._write, args=(port,), daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        for port in self._ports.values():
            with contextlib.suppress(OSError):
                os.close(port.descriptor)

    def _read(self, source: int) -> None:
        """Queue each packet a namespace sends for the namespace holding its destination, due `delay_s` from now
        (in order: the delay is the same for all, and changing it never reorders what is already queued)."""
        while not self._closing.is_set():
            try:
                packet = os.read(source, MTU + 64)
            except OSError:
                return
            sink = self._ports.get(_destination(packet))
            if sink is None:
                continue
            with self._lock:
                self.packets += 1
                self._sequence += 1
                sequence = self._sequence
                if self.record:
                    self.recorded.append(packet)
            with sink.arrived:
                sink.last_due = max(sink.last_due, time.monotonic() + self.delay_s)
                heapq.heappush(sink.queued, (sink.last_due, sequence, packet))
                sink.arrived.notify()

    def _write(self, port: _Port) -> None:
        while not self._closing.is_set():
            with port.arrived:
                while not port.queued and not self._closing.is_set():
                    port.arrived.wait(0.5)
                if not port.queued:
                    continue
                due, _, packet = port.queued[0]
                wait = due - time.monotonic()
                if wait > 0:
                    port.arrived.wait(wait)
                    continue
                heapq.heappop(port.queued)
            try:
                os.write(port.descriptor, packet)
            except OSError:
                if self._closing.is_set():
                    return
