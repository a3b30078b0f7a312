"""Real zenoh sessions in the test process: a bus alone (no listener) or several linked on 127.0.0.1."""

from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager

import anyio

from exo.cluster.bus import Bus
from exo.cluster.identity import new_node_id
from exo.cluster.settings import ClusterSettings, zenoh_config
from tests.exo_server import free_port


@asynccontextmanager
async def linked_buses(count: int) -> AsyncGenerator[list[Bus]]:
    """`count` buses, each listening on its own loopback port and dialling the first one; closed on exit."""
    ports = [free_port() for _ in range(count)]
    buses: list[Bus] = []
    try:
        for position, port in enumerate(ports):
            settings = ClusterSettings(
                listen=(f"tcp/127.0.0.1:{port}",),
                peers=(f"tcp/127.0.0.1:{ports[0]}",) if position else (),
                discovery=False,
            )
            buses.append(await Bus.open(zenoh_config(settings, new_node_id())))
        yield buses
    finally:
        for bus in buses:
            await bus.close()


async def eventually(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll `condition` until it holds, failing after `timeout` seconds (generous: the machine may be loaded)."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)
