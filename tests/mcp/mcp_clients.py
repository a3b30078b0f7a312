"""Connect the official `mcp` SDK client to exo's tools: `exo mcp` over stdio, or a node's `/mcp` endpoint."""

import sys
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Literal

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

McpTransport = Literal["stdio", "http"]
TRANSPORTS: tuple[McpTransport, ...] = ("stdio", "http")


def stdio_parameters(url: str, api_key: str | None) -> StdioServerParameters:
    """`python -m exo mcp --url URL [--api-key KEY]`, as an agent would start it (without the key in the env)."""
    key = ["--api-key", api_key] if api_key else []
    return StdioServerParameters(command=sys.executable, args=["-m", "exo", "mcp", "--url", url, *key], env={})


@asynccontextmanager
async def _http(url: str, api_key: str | None) -> AsyncGenerator[object]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as streams,
    ):
        yield streams


@asynccontextmanager
async def exo_mcp_client(transport: McpTransport, url: str, api_key: str | None) -> AsyncGenerator[Client]:
    """A connected client of exo's tools for the node at `url`, over `transport`."""
    server = stdio_parameters(url, api_key) if transport == "stdio" else _http(url, api_key)
    async with Client(server, read_timeout_seconds=300) as client:  # pyright: ignore[reportArgumentType]
        yield client


def text_of(result: CallToolResult) -> str:
    """The result's text (exo's tools answer with exactly one text block)."""
    assert len(result.content) == 1, result
    block = result.content[0]
    assert isinstance(block, TextContent), result
    return block.text
