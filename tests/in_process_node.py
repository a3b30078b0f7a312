"""A real node inside the test process (its runners are still subprocesses), alone in a cluster of its own, with
an HTTP client on its app. Always stopped on exit: an open cluster session would keep the test process alive."""

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import anyio
import httpx

from exo.api.app import create_app
from exo.cluster.settings import ClusterSettings
from exo.node import Node, NodeConfig, api_settings


@asynccontextmanager
async def in_process_node(config: NodeConfig, tmp_path: Path) -> AsyncGenerator[tuple[Node, httpx.AsyncClient]]:
    """Start `config` as a node with no cluster listener, no scouting and its own identity under `tmp_path`."""
    private = ClusterSettings(name=f"test-{uuid4().hex[:12]}", listen=(), discovery=False)
    node = Node(replace(config, cluster=private, home=tmp_path / "home"))
    await node.join()
    settings = api_settings(config)
    transport = httpx.ASGITransport(app=create_app(node.master_client, settings, node.publish_preparation))
    try:
        async with (
            anyio.create_task_group() as task_group,
            httpx.AsyncClient(transport=transport, base_url="http://node") as client,
        ):
            node.start(task_group)
            try:
                yield node, client
            finally:
                task_group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await node.stop()
