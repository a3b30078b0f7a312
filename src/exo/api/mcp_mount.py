"""The same tools on the node itself: MCP over streamable HTTP at `/mcp`, behind the node's API key.

The tools ask the node's own API over loopback with its key, exactly as `exo mcp` does from outside, so both serve
the same answers. The SDK's session manager runs once per app lifespan and cannot be restarted, so each lifespan
builds a fresh MCP app and `/mcp` forwards to the current one (test clients run the lifespan many times).
"""

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from exo.api.errors import ApiError, error_response
from exo.mcp.node_client import NodeClient
from exo.mcp.server import build_server

MCP_PATH = "/mcp"


def loopback_url(host: str, port: int) -> str:
    """The address this machine reaches a server bound to `host:port` at (a wildcard bind means loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _CurrentMcpApp:
    """The `/mcp` endpoint: forwards to the MCP app of the running lifespan."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            unavailable = ApiError(503, "the MCP endpoint is not running", error_type="server_error")
            await error_response(unavailable)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def mount_mcp(app: FastAPI, *, host: str, port: int, api_key: str | None) -> None:
    """Serve exo's MCP tools at `/mcp` of `app`, the API of the node bound to `host:port`."""
    endpoint = _CurrentMcpApp()
    app.router.routes.append(Route(MCP_PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    app_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(running: FastAPI) -> AsyncGenerator[None]:
        async with app_lifespan(running), NodeClient(loopback_url(host, port), api_key) as client:
            server = build_server(client)
            # On a loopback bind the SDK also checks Host/Origin headers, which stops DNS-rebinding web pages.
            endpoint.app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
            try:
                async with server.session_manager.run():
                    yield
            finally:
                endpoint.app = None

    app.router.lifespan_context = lifespan
