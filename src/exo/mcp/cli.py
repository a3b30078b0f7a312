"""`exo mcp`: serve exo's tools over MCP on stdin/stdout, asking a running node's HTTP API.

Agents start it as a local MCP server (opencode: `"command": ["uv", "run", "exo", "mcp"]`). Standard output is the
protocol, so everything else (logs) goes to standard error.
"""

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import anyio

from exo.mcp.node_client import DEFAULT_NODE_URL, NodeClient
from exo.mcp.server import build_server


def build_parser() -> argparse.ArgumentParser:
    """The `exo mcp` command line."""
    parser = argparse.ArgumentParser(
        prog="exo mcp", description="Serve exo's cluster tools to an agent over MCP (stdio), using a node's API."
    )
    parser.add_argument("--url", default=DEFAULT_NODE_URL, help=f"the node's API address (default {DEFAULT_NODE_URL})")
    parser.add_argument(
        "--api-key", default=os.environ.get("EXO_API_KEY"), help="the node's API key (default $EXO_API_KEY)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (to standard error)")
    return parser


async def serve(url: str, api_key: str | None) -> None:
    """Serve MCP on stdio until the client closes it."""
    async with NodeClient(url, api_key) as client:
        await build_server(client).run_stdio_async()


def main(argv: Sequence[str]) -> int:
    """Run `exo mcp` with `argv` (the words after `mcp`); returns the exit status."""
    arguments = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if arguments.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        anyio.run(serve, arguments.url, arguments.api_key or None)
    except KeyboardInterrupt:
        return 130
    return 0
