"""Slow clients cannot hold sockets forever: a real node closes connections whose headers never finish or whose body
stalls, keeps serving a slow but steady upload, and answers normal requests afterwards."""

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from exo.main import build_parser, config_from_args
from tests.exo_server import ExoServer, running_exo

HEADER_TIMEOUT = 1.5
BODY_TIMEOUT = 3.0
# How long after its timeout a connection may still be open on a loaded machine before the test calls it held.
SLACK = 20.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    arguments = ["--no-model", "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT)]
    with running_exo([], tmp_path_factory.mktemp("exo-timeouts"), arguments) as server:
        yield server


def connect(node: ExoServer) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", node.port), timeout=HEADER_TIMEOUT + SLACK)
    connection.settimeout(0.05)
    return connection


def closed_by_server(connection: socket.socket) -> bool:
    """Whether the server has closed `connection` (without waiting for it to)."""
    try:
        return connection.recv(65536) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def trickle_until_closed(connection: socket.socket, pieces: Iterator[bytes], interval: float) -> float:
    """Send `pieces` one per `interval` until the server closes the connection; seconds it stayed open."""
    started = time.monotonic()
    while time.monotonic() - started < HEADER_TIMEOUT + BODY_TIMEOUT + SLACK:
        if closed_by_server(connection):
            return time.monotonic() - started
        piece = next(pieces, b"")
        try:
            if piece:
                connection.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError("the server kept a stalled connection open")


def assert_still_serving(node: ExoServer) -> None:
    assert httpx.get(f"{node.base_url}/health", timeout=30).json() == {"status": "ok"}


def test_a_client_that_sends_nothing_is_disconnected(node: ExoServer) -> None:
    with connect(node) as connection:
        held = trickle_until_closed(connection, iter(()), 0.05)
    assert held >= HEADER_TIMEOUT * 0.9
    assert_still_serving(node)


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_deadline(node: ExoServer) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"X-Slow: " + b"a" * 10_000
    with connect(node) as connection:
        # A byte every 0.1 s: each arrives well within any idle timeout, so only a deadline for all of them stops it.
        held = trickle_until_closed(connection, (bytes([byte]) for byte in request), 0.1)
    assert held >= HEADER_TIMEOUT * 0.9
    assert_still_serving(node)


def test_a_body_that_stalls_is_cut_off(node: ExoServer) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    with connect(node) as connection:
        connection.sendall(head + b'{"model": "x", ')
        held = trickle_until_closed(connection, iter(()), 0.05)
    assert held >= BODY_TIMEOUT * 0.9
    assert_still_serving(node)


def test_a_slow_but_steady_body_is_served(node: ExoServer) -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"a" * 24 + b'"}]}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", node.port), timeout=60) as connection:
        connection.sendall(head)
        for index in range(0, len(body), 4):  # longer than the body timeout in all, never stalled that long
            connection.sendall(body[index : index + 4])
            time.sleep(0.3)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert time.monotonic() - started > BODY_TIMEOUT
    # A node serving no model refuses the request itself: the body was read whole and understood.
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 "), answer
    assert int(status_line.split()[1]) in (400, 404, 503), answer
    assert b'"error"' in answer
    assert_still_serving(node)


def test_the_timeouts_are_options_with_positive_values() -> None:
    config = config_from_args(build_parser().parse_args(["--header-timeout", "7", "--body-timeout", "2.5"]))
    assert (config.header_timeout_seconds, config.body_timeout_seconds) == (7.0, 2.5)
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--body-timeout", bad])
