"""The TLS relay a keyed cluster's pipeline ranks talk through (pipeline_relay.py), as real processes on loopback.

Two relays with the key carry bytes both ways between a "rank" dialling its relay's loopback port and a "rank"
listening behind the other relay, as the ring and the task connections use them. The far relay's public port
refuses a plain TCP dialler, a dialler with another key's certificates, and one trusting the authority but holding
no certificate of its own: none of them ever reaches the rank behind it.
"""

import base64
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import closing

import pytest

from exo.cluster.cluster_tls import tls_link_config
from exo.cluster.socket_tls import client_context
from exo.worker.runner.pipeline_relay import InboundTunnel, PipelineRelay, RelayPlan
from tests.ports import free_port

CLUSTER = "relay-test"
KEY = "a key for the pipeline relay test"


class EchoRank:
    """A rank listening on loopback behind a relay: answers every chunk upper-cased, counts its connections."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._echo, args=(client,), daemon=True).start()

    @staticmethod
    def _echo(client: socket.socket) -> None:
        with closing(client):
            while data := client.recv(65536):
                client.sendall(data.upper())


@pytest.fixture
def far() -> Iterator[tuple[EchoRank, str]]:
    """A rank behind a keyed relay, and the relay's public address."""
    rank = EchoRank()
    public = f"127.0.0.1:{free_port()}"
    relay = PipelineRelay.start(
        RelayPlan(
            tls=tls_link_config(KEY, CLUSTER), inbound=(InboundTunnel(public=public, port=rank.port),), outbound=()
        )
    )
    try:
        yield rank, public
    finally:
        relay.close()
        rank.server.close()


def _receive(connection: socket.socket, size: int) -> bytes:
    received = b""
    while len(received) < size:
        chunk = connection.recv(size - len(received))
        if not chunk:
            break
        received += chunk
    return received


def test_two_keyed_relays_carry_bytes_both_ways(far: tuple[EchoRank, str]) -> None:
    rank, public = far
    near = PipelineRelay.start(RelayPlan(tls=tls_link_config(KEY, CLUSTER), inbound=(), outbound=(public,)))
    try:
        payload = b"activations " * 20000  # larger than one TLS record and one read
        with socket.create_connection(("127.0.0.1", near.outbound_ports[0]), timeout=10) as connection:
            connection.sendall(payload)
            assert _receive(connection, len(payload)) == payload.upper()
        assert rank.connections == 1
    finally:
        near.close()


def test_a_relay_with_another_key_never_reaches_the_rank(far: tuple[EchoRank, str]) -> None:
    rank, public = far
    other_key = tls_link_config("another key, not the cluster's", CLUSTER)
    near = PipelineRelay.start(RelayPlan(tls=other_key, inbound=(), outbound=(public,)))
    try:
        with socket.create_connection(("127.0.0.1", near.outbound_ports[0]), timeout=3) as connection:
            connection.sendall(b"hello")
            with pytest.raises(TimeoutError):
                connection.recv(100)  # its relay keeps dialling, and is refused each time
        assert rank.connections == 0
    finally:
        near.close()


def _answer(context: ssl.SSLContext, host: str, port: int) -> bytes | None:
    """What a TLS dialler with `context` reads back after sending "hello" (None: the handshake or the read failed)."""
    try:
        with socket.create_connection((host, port), timeout=5) as raw, context.wrap_socket(raw) as wrapped:
            wrapped.sendall(b"hello")
            return wrapped.recv(100)
    except (ssl.SSLError, OSError):
        return None


def test_plain_tcp_and_certificate_less_diallers_are_refused(far: tuple[EchoRank, str]) -> None:
    rank, public = far
    host, port = public.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as plain:
        plain.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert not plain.recv(100).upper().startswith(b"GET")  # never echoed: at most a TLS alert
    # Trusts the authority but presents no certificate of its own.
    no_certificate = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    no_certificate.check_hostname = False
    authority = tls_link_config(KEY, CLUSTER).root_ca_certificate_base64
    no_certificate.load_verify_locations(cadata=base64.b64decode(authority).decode())
    assert _answer(no_certificate, host, int(port)) in (None, b"")
    assert rank.connections == 0
    # With the key's certificates the same dialler gets through: the refusals above are the certificate's doing.
    assert _answer(client_context(tls_link_config(KEY, CLUSTER)), host, int(port)) == b"HELLO"
    assert rank.connections == 1
