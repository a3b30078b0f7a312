"""Load the tools of MCP servers and extension processes into a registry, for as long as the agent runs."""

import logging
import shlex
from collections.abc import Generator, Sequence
from contextlib import ExitStack, contextmanager

from anyio.from_thread import start_blocking_portal

from examples.agent_tools.extension import DEFAULT_CALL_TIMEOUT_SECONDS, DEFAULT_READY_GRACE_SECONDS, Extension
from examples.agent_tools.mcp_servers import McpServers
from examples.agent_tools.registry import RemoteTool, ToolRegistry

logger = logging.getLogger(__name__)


def parse_header(text: str) -> tuple[str, str]:
    """`"Name: value"` → ("Name", "value"), for the headers sent to MCP servers reached by URL."""
    name, separator, value = text.partition(":")
    if not separator or not name.strip():
        raise ValueError(f"a header is 'Name: value', got {text!r}")
    return name.strip(), value.strip()


@contextmanager
def discovered_tools(
    registry: ToolRegistry,
    *,
    mcp_servers: Sequence[str] = (),
    mcp_headers: dict[str, str] | None = None,
    extensions: Sequence[str] = (),
    ready_grace_seconds: float = DEFAULT_READY_GRACE_SECONDS,
    call_timeout_seconds: float = DEFAULT_CALL_TIMEOUT_SECONDS,
) -> Generator[ToolRegistry]:
    """Add every MCP server's and extension's tools to `registry`; on exit, end the sessions and processes.

    `mcp_servers` are command lines (run as stdio servers) or URLs; `extensions` are command lines. Nothing here
    stops start-up: an unreachable server, a broken tool declaration or a wedged extension is logged and skipped.
    """
    with ExitStack() as stack:
        for command in extensions:
            argv = shlex.split(command)
            try:
                extension = Extension(argv, call_timeout_seconds=call_timeout_seconds)
            except (OSError, IndexError) as error:  # IndexError: an empty command
                logger.warning("skipping extension %r: cannot start it (%s)", command, error)
                continue
            stack.callback(extension.close)
            _add_all(registry, extension.tools(ready_grace_seconds))
        if mcp_servers:
            portal = stack.enter_context(start_blocking_portal())
            servers = stack.enter_context(McpServers(portal, call_timeout_seconds=call_timeout_seconds))
            for spec in mcp_servers:
                _add_all(registry, servers.connect(spec, mcp_headers))
        yield registry


def _add_all(registry: ToolRegistry, tools: list[RemoteTool]) -> None:
    for tool in tools:
        registry.add_remote(tool)
