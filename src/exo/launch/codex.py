"""Codex CLI: exo as a Responses API provider, by `-c` overrides on the command line.

Overrides leave the user's ~/.codex (their login, sessions, AGENTS.md, other settings) as it is and win over it for
this run. What docs/AGENTS.md tells users to set is set: the provider and model with its context window, Codex's
hosted web search and sub-agent tools off (exo refuses tools it cannot run), its sandbox to workspace-write (so it
may change files in the project, and nothing outside it), and `codex exec` allowed outside a git repository. The
user's own flags come after and win (`--sandbox`, `-c`, ...).
"""

import json
from typing import Final, Literal

from exo.launch.plan import API_KEY_VARIABLE, EXO_NAME, ClientInfo, ClientPlan, LaunchTarget
from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import LOOP_GUARD_HEADER, LoopGuardPolicy

CLIENT: Final = ClientInfo(
    name="codex",
    display_name="Codex CLI",
    binary="codex",
    package="@openai/codex",
    tested_version="0.169.0",
    folder="codex",
)
# `codex exec` (alias `e`) refuses to start outside a git repository without this flag, which only it accepts.
EXEC_SUBCOMMANDS: Final = ("exec", "e")
GIT_CHECK_FLAG: Final = "--skip-git-repo-check"

TomlValue = str | int | bool | tuple[str, ...]


class CodexOverride(FrozenModel):
    """One `-c key=value`: a dotted path into config.toml and its value."""

    key: str
    value: TomlValue

    def argument(self) -> str:
        return f"{self.key}={toml_literal(self.value)}"


def toml_literal(value: TomlValue) -> str:
    """`value` as TOML: a JSON string is a valid TOML basic string, a JSON array of them a TOML array."""
    match value:
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case str():
            return json.dumps(value)
        case tuple():
            return "[" + ", ".join(json.dumps(item) for item in value) + "]"


class CodexSettings(FrozenModel):
    """What the launch sets in Codex's configuration."""

    model: str
    base_url: str
    context_window: int | None = None
    key_variable: str | None = None
    sandbox_mode: Literal["read-only", "workspace-write", "danger-full-access"] = "workspace-write"
    mcp_command: tuple[str, ...] | None = None
    loop_guard: LoopGuardPolicy | None = None

    def overrides(self) -> list[CodexOverride]:
        provider = f"model_providers.{EXO_NAME}"
        settings: list[tuple[str, TomlValue | None]] = [
            ("model", self.model),
            ("model_provider", EXO_NAME),
            (f"{provider}.name", EXO_NAME),
            (f"{provider}.base_url", self.base_url),
            (f"{provider}.wire_api", "responses"),
            (f"{provider}.env_key", self.key_variable),
            ("model_context_window", self.context_window),
            # Hosted tools need OpenAI's servers: exo refuses a request that offers them.
            ("web_search", "disabled"),
            ("agents.enabled", False),
            ("sandbox_mode", self.sandbox_mode),
            # A header Codex sends with every request to the provider (its `http_headers` table, one key of it).
            (f"{provider}.http_headers.{LOOP_GUARD_HEADER}", self.loop_guard),
        ]
        if self.mcp_command is not None:
            server = f"mcp_servers.{EXO_NAME}"
            settings += [(f"{server}.command", self.mcp_command[0]), (f"{server}.args", self.mcp_command[1:])]
            # Codex starts MCP servers with a trimmed environment: the key has to be passed on by name.
            settings.append((f"{server}.env_vars", (self.key_variable,) if self.key_variable else None))
        return [CodexOverride(key=key, value=value) for key, value in settings if value is not None]


def settings(target: LaunchTarget) -> CodexSettings:
    return CodexSettings(
        model=target.model,
        base_url=target.openai_url,
        context_window=target.context_length,
        key_variable=API_KEY_VARIABLE if target.api_key else None,
        mcp_command=None if target.mcp is None else (target.mcp.command, *target.mcp.arguments),
        loop_guard=target.loop_guard,
    )


def plan(target: LaunchTarget) -> ClientPlan:
    """`-c` overrides before the user's arguments, and the git check's flag after `exec`."""
    leading = tuple(word for override in settings(target).overrides() for word in ("-c", override.argument()))
    return ClientPlan(
        leading_arguments=leading,
        arguments_after_subcommand=dict.fromkeys(EXEC_SUBCOMMANDS, (GIT_CHECK_FLAG,)),
        environment={API_KEY_VARIABLE: target.api_key} if target.api_key else {},
    )
