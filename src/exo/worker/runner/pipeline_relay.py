"""TLS for a split model's own sockets in a keyed cluster: a small relay process beside each rank's runner.

The ranks talk over mlx.distributed's ring (raw TCP inside mlx) and over exo's task connections. In a keyed cluster
neither dials the other ranks directly: each rank dials its own relay on loopback, which opens a mutual-TLS
connection (the cluster's certificates, cluster_tls) to the other rank's relay at the address drawn at placement;
that relay checks the dialler's certificate and hands the plain bytes on to its rank on loopback. What crosses the
network is TLS from the first byte, and a program without the key can neither dial a rank nor be dialled as one.

A separate process rather than a thread of the runner: mlx holds the GIL while its ring forms, and the runner's
main thread computes. The relay reads its plan as one JSON line on stdin, answers with the loopback ports of its
outbound tunnels on stdout, and exits when stdin closes (its runner ended, however it ended).
"""

import asyncio
import contextlib
import logging
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from exo.cluster.socket_tls import client_context, server_context
from exo.shared.types.common import FrozenModel
from exo.shared.types.tls_link import TlsLinkConfig

logger = logging.getLogger(__name__)

DIAL_RETRY_SECONDS = 0.2
DIAL_DEADLINE_SECONDS = 300.0
"""How long a tunnel keeps dialling its far end: the other ranks may still be starting (or loading)."""
_CHUNK = 1 << 16
_Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


class InboundTunnel(FrozenModel):
    """TLS accepted at `public` ("host:port", drawn at placement), handed on plain to this rank at loopback `port`."""

    public: str
    port: int


class RelayPlan(FrozenModel):
    tls: TlsLinkConfig
    inbound: tuple[InboundTunnel, ...]
    outbound: tuple[str, ...]
    """Far ends ("host:port") this rank dials: each gets a loopback port, and what is dialled there goes over TLS."""


class RelayPorts(FrozenModel):
    outbound: tuple[int, ...]
    """The loopback port of each outbound tunnel, in the plan's order."""


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


async def _dial(
    host: str, port: int, context: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a connection, retrying while nothing answers yet (a refused or failed handshake is retried too)."""
    deadline = time.monotonic() + DIAL_DEADLINE_SECONDS
    while True:
        try:
            return await asyncio.open_connection(host, port, ssl=context)
        except (OSError, ssl.SSLError) as error:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{host}:{port} did not answer within {DIAL_DEADLINE_SECONDS:.0f} s") from error
            await asyncio.sleep(DIAL_RETRY_SECONDS)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()


async def _pipe(
    near: tuple[asyncio.StreamReader, asyncio.StreamWriter], far: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    """Copy both ways until either side ends, then close both (the other end then sees its peer go, as it would
    on a direct connection)."""
    copies = [asyncio.ensure_future(_copy(near[0], far[1])), asyncio.ensure_future(_copy(far[0], near[1]))]
    await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
    for copy in copies:
        copy.cancel()
    for writer in (near[1], far[1]):
        writer.close()


async def _serve(plan: RelayPlan) -> RelayPorts:
    server_tls, client_tls = server_context(plan.tls), client_context(plan.tls)

    def inbound(tunnel: InboundTunnel) -> _Handler:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # The handshake (the dialler's certificate checked) is done by now: a dialler without one never gets here.
            try:
                near = await _dial("127.0.0.1", tunnel.port, None)
            except TimeoutError as error:
                logger.warning("a rank's tunnel from %s found no rank behind it: %s", tunnel.public, error)
                writer.close()
                return
            await _pipe(near, (reader, writer))

        return accept

    def outbound(far_end: str) -> _Handler:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            host, port = split_address(far_end)
            try:
                far = await _dial(host, port, client_tls)
            except TimeoutError as error:
                logger.warning("a rank's tunnel to %s could not be opened: %s", far_end, error)
                writer.close()
                return
            await _pipe((reader, writer), far)

        return accept

    for tunnel in plan.inbound:
        host, port = split_address(tunnel.public)
        await asyncio.start_server(inbound(tunnel), host, port, ssl=server_tls)
    ports: list[int] = []
    for far_end in plan.outbound:
        server = await asyncio.start_server(outbound(far_end), "127.0.0.1", 0)
        ports.append(server.sockets[0].getsockname()[1])
    return RelayPorts(outbound=tuple(ports))


async def _main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    plan = RelayPlan.model_validate_json(await reader.readline())
    ports = await _serve(plan)
    sys.stdout.write(ports.model_dump_json() + "\n")
    sys.stdout.flush()
    await reader.read()  # until the runner closes stdin


@dataclass
class PipelineRelay:
    """A running relay process and the loopback ports of its outbound tunnels."""

    process: subprocess.Popen[bytes]
    outbound_ports: tuple[int, ...]

    @classmethod
    def start(cls, plan: RelayPlan) -> "PipelineRelay":
        """Start a relay for `plan`; returns once it listens (raises RuntimeError if it could not)."""
        process = subprocess.Popen(
            [sys.executable, "-m", "exo.worker.runner.pipeline_relay"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(plan.model_dump_json().encode() + b"\n")
        process.stdin.flush()
        answer = process.stdout.readline()
        if not answer:
            process.wait()
            raise RuntimeError(f"the pipeline's TLS relay did not start (exit status {process.returncode})")
        return cls(process=process, outbound_ports=RelayPorts.model_validate_json(answer).outbound)

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="pipeline-relay %(levelname)s %(message)s")
    asyncio.run(_main())
