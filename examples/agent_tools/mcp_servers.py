"""Tools from MCP servers, through the official `mcp` SDK client: a command (stdio) or a URL (streamable HTTP).

The agent loop is synchronous; MCP sessions are async and long-lived. Every session therefore lives on one
background event loop (an anyio blocking portal) for the agent's whole run, and each tool call crosses over to it
with a time limit. A server that cannot be reached is logged and skipped: the agent starts with the tools it has.
"""

import json
import logging
import shlex
from collections.abc import AsyncGenerator
from contextlib import ExitStack, asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx2
from anyio.from_thread import BlockingPortal
from mcp import Client
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent
from mcp_types import Tool as McpTool

from examples.agent_tools.extension import DEFAULT_CALL_TIMEOUT_SECONDS
from examples.agent_tools.registry import RemoteTool, ToolReply

logger = logging.getLogger(__name__)

# The SDK's own defaults: a server may hold a response stream open for a long call.
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


def is_url(spec: str) -> bool:
    """Whether an `--mcp` argument names a streamable-HTTP endpoint rather than a command to run."""
    return spec.startswith(("http://", "https://"))


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncGenerator[Any]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=_HTTP_TIMEOUT) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def _target(spec: str, headers: dict[str, str]) -> Transport | StdioServerParameters:
    if is_url(spec):
        transport: Transport = _http_transport(spec, headers)
        return transport
    argv = shlex.split(spec)
    return StdioServerParameters(command=argv[0], args=argv[1:])


def reply_text(result: CallToolResult) -> str:
    """What the model reads: the result's text blocks, else its structured content as JSON."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    kinds = ", ".join(sorted({block.type for block in result.content})) or "nothing"
    return f"(the tool returned {kinds}, which this agent cannot show)"


async def _call_tool(client: Client, name: str, arguments: dict[str, Any], timeout_seconds: float) -> ToolReply:
    try:
        with anyio.fail_after(timeout_seconds):
            result = await client.call_tool(name, arguments)
    except TimeoutError:
        raise TimeoutError(f"{name} (MCP) did not answer within {timeout_seconds:g}s") from None
    return ToolReply(text=reply_text(result), is_error=result.is_error)


class McpServers:
    """The MCP servers the agent loads tools from; close it (or use `with`) to end their sessions."""

    def __init__(self, portal: BlockingPortal, *, call_timeout_seconds: float = DEFAULT_CALL_TIMEOUT_SECONDS) -> None:
        self._portal = portal
        self._sessions = ExitStack()
        self.call_timeout_seconds = call_timeout_seconds

    def __enter__(self) -> "McpServers":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def connect(self, spec: str, headers: dict[str, str] | None = None) -> list[RemoteTool]:
        """Start or reach the server `spec` (a command line or a URL) and return its tools; [] if unreachable.

        `headers` go with every request to a URL (an `Authorization: Bearer` key, for exo's `/mcp`).
        """
        target = _target(spec, headers or {})
        try:
            client = self._sessions.enter_context(self._portal.wrap_async_context_manager(Client(target)))
            listed = self._portal.call(_all_tools, client)
        except (OSError, MCPError, httpx2.HTTPError, ExceptionGroup) as error:
            logger.warning("skipping MCP server %r: cannot reach it (%s)", spec, _describe(error))
            return []
        source = f"mcp server {spec!r}"
        return [
            RemoteTool(
                name=tool.name,
                description=tool.description or tool.title or "",
                parameters=tool.input_schema,
                source=source,
                invoke=partial(self._call, client, tool.name),
            )
            for tool in listed
        ]

    def close(self) -> None:
        """End every session (stdio servers are stopped)."""
        self._sessions.close()

    def _call(self, client: Client, name: str, arguments: dict[str, Any]) -> ToolReply:
        return self._portal.call(_call_tool, client, name, arguments, self.call_timeout_seconds)


async def _all_tools(client: Client) -> list[McpTool]:
    tools: list[McpTool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools


def _describe(error: BaseException) -> str:
    # Transports fail inside task groups; the first leaf says what actually went wrong.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"
