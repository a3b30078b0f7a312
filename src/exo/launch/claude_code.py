"""Claude Code: exo's Messages API by environment variables (names read by Claude Code 2.1.197).

Every model slot Claude Code has is mapped to the served model: the main one, the small/fast one of its background
requests, the opus/sonnet/haiku aliases (`/model`, and agents that name one) and sub-agents. The key goes as a
bearer token (ANTHROPIC_AUTH_TOKEN), which Claude Code sends without asking the user to approve a custom API key;
ANTHROPIC_API_KEY is emptied so a real Anthropic key in the user's environment never reaches the node. The other
settings keep its prompt the same from request to request, so exo's prefix cache serves it (docs/AGENTS.md), and
keep it from calling anything but exo.
"""

import json
from pathlib import Path
from typing import Final

from pydantic import ConfigDict, Field

from exo.launch.plan import EXO_NAME, ClientInfo, ClientPlan, LaunchTarget, content_addressed
from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import LOOP_GUARD_HEADER

CLIENT: Final = ClientInfo(
    name="claude",
    display_name="Claude Code",
    binary="claude",
    package="@anthropic-ai/claude-code",
    tested_version="2.1.197",
    folder="claude-code",
)
MODEL_VARIABLES: Final = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)
STABLE_PROMPT_SETTINGS: Final = {
    # A billing line first in the system prompt, new with every request: exo drops it, this stops it being sent.
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    # The auto-memory section names a folder derived from the project's path.
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    # No telemetry, error reports or update checks: nothing but exo is called.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    # A CPU can take longer than the 10-minute default to read a long prompt.
    "API_TIMEOUT_MS": "3600000",
}
# Switches in the user's environment that would send Claude Code to another provider than ANTHROPIC_BASE_URL.
OTHER_PROVIDERS: Final = (
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "CLAUDE_CODE_USE_ANTHROPIC_AWS",
    "CLAUDE_CODE_USE_GATEWAY",
    "CLAUDE_CODE_USE_MANTLE",
)
# Extra request headers, one `Name: value` a line, that Claude Code sends with every API request.
CUSTOM_HEADERS_VARIABLE: Final = "ANTHROPIC_CUSTOM_HEADERS"
# Claude Code needs some token to send; exo without --api-key takes any.
PLACEHOLDER_TOKEN: Final = "exo"


class StdioMcpServer(FrozenModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str
    args: tuple[str, ...]


class McpConfig(FrozenModel):
    """The file `claude --mcp-config` reads."""

    model_config = ConfigDict(frozen=True, extra="forbid", serialize_by_alias=True)

    servers: dict[str, StdioMcpServer] = Field(serialization_alias="mcpServers")


def environment(target: LaunchTarget) -> dict[str, str]:
    """Every variable the launch sets for Claude Code."""
    return {
        "ANTHROPIC_BASE_URL": target.url,
        "ANTHROPIC_AUTH_TOKEN": target.api_key or PLACEHOLDER_TOKEN,
        "ANTHROPIC_API_KEY": "",
        **dict.fromkeys(MODEL_VARIABLES, target.model),
        **STABLE_PROMPT_SETTINGS,
    }


def plan(target: LaunchTarget, folder: Path) -> ClientPlan:
    """The environment, and with exo's tools an MCP configuration file in `folder` named by --mcp-config."""
    files: dict[Path, str] = {}
    leading: tuple[str, ...] = ()
    if target.mcp is not None:
        servers = {EXO_NAME: StdioMcpServer(command=target.mcp.command, args=target.mcp.arguments)}
        content = json.dumps(McpConfig(servers=servers).model_dump(mode="json"), indent=2) + "\n"
        path = content_addressed(folder, "mcp", ".json", content)
        files[path] = content
        leading = (f"--mcp-config={path}",)
    variables = environment(target)
    if target.api_key:
        variables["EXO_API_KEY"] = target.api_key  # for `exo mcp`, which Claude Code starts with its environment
    headers = {CUSTOM_HEADERS_VARIABLE: f"{LOOP_GUARD_HEADER}: {target.loop_guard}"} if target.loop_guard else {}
    return ClientPlan(
        files=files,
        leading_arguments=leading,
        environment=variables,
        removed_variables=OTHER_PROVIDERS,
        appended_lines=headers,
    )
