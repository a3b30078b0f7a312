"""Loopback ports handed to servers started later: outside the kernel's ephemeral range, never twice, never bound."""

import socket
from pathlib import Path

import pytest

from exo.shared import loopback_ports
from exo.shared.loopback_ports import free_loopback_port


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [free_loopback_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(10000 <= port < _ephemeral_low() for port in ports)


def test_a_port_bound_to_zero_meanwhile_cannot_take_a_handed_out_port() -> None:
    handed = {free_loopback_port() for _ in range(50)}
    probes = [socket.socket() for _ in range(200)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        assert handed.isdisjoint(probe.getsockname()[1] for probe in probes)
    finally:
        for probe in probes:
            probe.close()


def test_a_port_something_is_bound_to_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken_port = int(taken.getsockname()[1])
        draws = iter([taken_port, taken_port, *range(10000, 32000)])
        monkeypatch.setattr(loopback_ports._choose, "randint", lambda _low, _high: next(draws))  # pyright: ignore[reportPrivateUsage]
        chosen = free_loopback_port()
    assert chosen != taken_port
    assert 10000 <= chosen < 32000


def test_an_unusual_port_range_falls_back_to_the_kernels_choice_still_never_repeated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("10500\t60999\n")
    monkeypatch.setattr(loopback_ports, "_EPHEMERAL_RANGE", narrow)
    ports = [free_loopback_port() for _ in range(100)]
    assert len(set(ports)) == len(ports)
    assert all(port >= _ephemeral_low() for port in ports)
