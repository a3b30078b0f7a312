"""The exo MCP server: each tool is a typed function of the node client, given MCP annotations and two results.

Every tool answers with a structured result (its JSON schema is the tool's output schema) and a readable text of the
same facts. Every failure — exo down, the API key refused, an unknown node or model, a model too large for the
cluster — is an error result whose text says what is wrong and what to do; the server itself never fails a call.
"""

import inspect
import re
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from exo.mcp.failures import ToolFailedError
from exo.mcp.inference import DEFAULT_MAX_TOKENS, RunResult, run_model
from exo.mcp.models import ModelsResult, describe_download, download_model, list_models
from exo.mcp.node_client import NodeApiError, NodeClient, NodeUnreachableError
from exo.mcp.status import StatusResult, status
from exo.shared.types.catalog_api import DownloadDone

INSTRUCTIONS = (
    "Tools to look after an exo cluster (LLM inference on MLX): check that exo is up, read its nodes, memory and "
    "models, run a prompt on a model. Check the cluster's free memory before running or fetching a large model."
)


Result = TypeVar("Result", bound=BaseModel)
ToolFunction = TypeVar("ToolFunction", bound=Callable[..., Any])


def _reads(title: str) -> ToolAnnotations:
    return ToolAnnotations(title=title, read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def _description(function: Callable[..., Any]) -> str:
    # Models read this: no docstring indentation, and a wrapped line joined back into its sentence.
    return re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(function.__doc__ or ""))


def _tool(server: MCPServer, name: str, annotations: ToolAnnotations) -> Callable[[ToolFunction], ToolFunction]:
    def register(function: ToolFunction) -> ToolFunction:
        server.add_tool(function, name=name, description=_description(function), annotations=annotations)
        return function

    return register


async def _answer(work: Awaitable[Result], render: Callable[[Result], str]) -> CallToolResult:
    """The tool's result (structured, and as text), or its failure as an error result the agent can read."""
    try:
        result = await work
    except ToolFailedError as failure:
        partial = failure.partial.model_dump(mode="json") if failure.partial is not None else None
        return CallToolResult(
            content=[TextContent(type="text", text=str(failure))], structured_content=partial, is_error=True
        )
    except (NodeUnreachableError, NodeApiError) as error:
        return CallToolResult(content=[TextContent(type="text", text=str(error))], is_error=True)
    return CallToolResult(
        content=[TextContent(type="text", text=render(result))], structured_content=result.model_dump(mode="json")
    )


def build_server(client: NodeClient) -> MCPServer:
    """The MCP server whose tools ask the node behind `client`."""
    server = MCPServer("exo", title="exo", version=version("exo"), instructions=INSTRUCTIONS, log_level="WARNING")

    @_tool(server, "exo_status", _reads("exo status"))
    async def exo_status() -> Annotated[CallToolResult, StatusResult]:
        """Is exo running and is its API usable? Returns the node id, version, number of peers and the models it
        serves with their state. An error result when exo is not running or refuses the API key."""
        return await _answer(status(client), StatusResult.describe)

    @_tool(server, "exo_list_models", _reads("exo models"))
    async def exo_list_models() -> Annotated[CallToolResult, ModelsResult]:
        """The models exo serves (id, state, where they load from, context length, tool-call format) and the
        catalog of models exo can fetch: family, size, download and disk size, the memory each needs to be served,
        and whether it is downloaded."""
        return await _answer(list_models(client), ModelsResult.describe)

    @_tool(
        server,
        "exo_download_model",
        ToolAnnotations(
            title="Download a model into exo",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=True,
        ),
    )
    async def exo_download_model(
        model: Annotated[str, Field(description="a model id from exo's catalog (see exo_list_models)")],
        context: Context[Any, Any],
    ) -> Annotated[CallToolResult, DownloadDone]:
        """Changes the cluster: downloads a catalog model into the node's models directory and converts it for
        MLX (gigabytes of disk; minutes), sending progress notifications as it goes. Returns where it landed; an
        already downloaded model returns at once."""
        return await _answer(download_model(client, model, context.report_progress), describe_download)

    @_tool(
        server,
        "exo_run_model",
        ToolAnnotations(
            title="Run a prompt on an exo model", read_only_hint=True, idempotent_hint=False, open_world_hint=False
        ),
    )
    async def exo_run_model(
        model: Annotated[str, Field(description="a model id that exo serves (see exo_list_models)")],
        prompt: Annotated[str, Field(description="the user message to send")],
        temperature: Annotated[float | None, Field(ge=0.0, le=2.0, description="sampling temperature")] = None,
        max_tokens: Annotated[int, Field(ge=1, le=32768, description="most tokens to generate")] = DEFAULT_MAX_TOKENS,
    ) -> Annotated[CallToolResult, RunResult]:
        """Run one prompt on a model through exo's chat-completions API and return the answer with its timing
        (tokens, seconds, tokens/s)."""
        return await _answer(run_model(client, model, prompt, temperature, max_tokens), RunResult.describe)

    return server
