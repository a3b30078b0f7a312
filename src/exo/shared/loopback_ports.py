"""Free loopback ports for sockets bound later (a rank's hostfile, a child process's command line).

A port read back from a socket bound to port 0 is an ephemeral port: once that probe closes, the kernel may hand the
same port to the next socket bound to port 0 (another probe, a listener started with port 0) before the intended
owner binds it — two ports chosen one after the other came back equal often enough to fail a node's start. Ports
handed out here come from below the kernel's ephemeral range, so no port-0 bind can take them, and never twice from
one process."""

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the ephemeral range of every common kernel (Linux 32768-60999, macOS and Windows 49152-65535).
_DEFAULT_EPHEMERAL_LOW = 32768
_LOWEST = 10000
_ATTEMPTS = 500

_handed_out: set[int] = set()
_choose = random.SystemRandom()  # not the module's generator: processes forked from one parent would agree


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to now, outside the ephemeral range and new to this process."""
    highest = min(_ephemeral_low(), _DEFAULT_EPHEMERAL_LOW) - 1
    if highest - _LOWEST >= 1000:
        for _ in range(_ATTEMPTS):
            port = _choose.randint(_LOWEST, highest)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    return _ephemeral_port()  # an unusual port range, or a crowded one: the kernel's choice, still never repeated


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_port() -> int:
    for _ in range(_ATTEMPTS):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError("no free loopback port")
