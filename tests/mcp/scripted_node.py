"""A scripted node API for the MCP tools' own logic: fixed typed answers per path, served through httpx's mock
transport, and the real MCP server and SDK client in process. The end-to-end tests use real nodes; this is for
answers a real node cannot be made to give on demand (a download's exact event sequence, broken replies)."""

import json
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import httpx
from mcp import Client
from pydantic import BaseModel

from exo.mcp.node_client import NodeClient
from exo.mcp.server import build_server

SCRIPTED_URL = "http://scripted-node:52415"
Reply = BaseModel | httpx.Response | Callable[[httpx.Request], httpx.Response]


def sse(events: Sequence[BaseModel]) -> httpx.Response:
    """A server-sent-events response carrying `events` as `data:` lines."""
    body = "".join(f"data: {event.model_dump_json()}\n\n" for event in events)
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def error(status: int, message: str, code: str | None = None) -> httpx.Response:
    """An OpenAI-shaped error response, as the node sends them."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return httpx.Response(status, json=body)


def scripted_transport(replies: Mapping[str, Reply], requests: list[httpx.Request]) -> httpx.MockTransport:
    """Answer `METHOD /path` from `replies` (404 otherwise), recording every request."""

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        reply = replies.get(f"{request.method} {request.url.path}")
        if reply is None:
            return error(404, f"scripted node has no {request.method} {request.url.path}")
        if isinstance(reply, httpx.Response):
            return reply
        if isinstance(reply, BaseModel):
            return httpx.Response(200, json=json.loads(reply.model_dump_json()))
        return reply(request)

    return httpx.MockTransport(answer)


@asynccontextmanager
async def scripted_tools(replies: Mapping[str, Reply], requests: list[httpx.Request]) -> AsyncGenerator[Client]:
    """An MCP client of exo's tools whose node is `replies`."""
    async with (
        NodeClient(SCRIPTED_URL, transport=scripted_transport(replies, requests)) as node,
        Client(build_server(node)) as client,
    ):
        yield client
