"""opencode: exo as an OpenAI-compatible provider, in a configuration file of the launch's own (OPENCODE_CONFIG).

opencode merges that file over the user's global configuration and under the project's opencode.json, so the
user's files stay untouched and a project can still change the agent. What docs/OPENCODE.md tells users to set is
set here: the provider and model with its context, header and chunk timeouts off, and edits allowed (a headless
`opencode run` cannot answer a permission prompt).
"""

import json
from pathlib import Path
from typing import Final, Literal

from pydantic import ConfigDict, Field

from exo.launch.plan import API_KEY_VARIABLE, EXO_NAME, ClientInfo, ClientPlan, LaunchTarget, content_addressed
from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import LOOP_GUARD_HEADER

CLIENT: Final = ClientInfo(
    name="opencode",
    display_name="opencode",
    binary="opencode",
    package="opencode-ai",
    tested_version="1.18.33",
    folder="opencode",
)
CONFIG_VARIABLE: Final = "OPENCODE_CONFIG"
# The most a reply may take; opencode asks for 32,000 tokens unless told, more than a small model's whole context.
LONGEST_OUTPUT_TOKENS: Final = 8192


class _Config(FrozenModel):
    # opencode's own key names (camelCase, `$schema`) are written through aliases.
    model_config = ConfigDict(frozen=True, extra="forbid", serialize_by_alias=True)


class ModelLimit(_Config):
    context: int
    output: int


class ProviderModel(_Config):
    name: str
    tool_call: bool = True
    limit: ModelLimit | None = None


class ProviderOptions(_Config):
    base_url: str = Field(serialization_alias="baseURL")
    # `{env:…}` is opencode's substitution: the key stays in the environment, not in the file.
    api_key: str | None = Field(default=None, serialization_alias="apiKey")
    # exo answers headers at once and streams keep-alives; off anyway, as for a proxy that buffers the stream.
    header_timeout: Literal[False] = Field(default=False, serialization_alias="headerTimeout")
    chunk_timeout: Literal[False] = Field(default=False, serialization_alias="chunkTimeout")
    # Sent with every request (the AI SDK's provider headers): --loop-guard's X-Exo-Loop-Guard.
    headers: dict[str, str] | None = None


class Provider(_Config):
    npm: str = "@ai-sdk/openai-compatible"
    name: str = EXO_NAME
    options: ProviderOptions
    models: dict[str, ProviderModel]


class Permission(_Config):
    edit: Literal["allow", "ask", "deny"] = "allow"


class LocalMcpServer(_Config):
    type: Literal["local"] = "local"
    command: tuple[str, ...]
    enabled: bool = True


class OpencodeConfig(_Config):
    schema_url: str = Field(default="https://opencode.ai/config.json", serialization_alias="$schema")
    model: str
    small_model: str
    permission: Permission = Permission()
    provider: dict[str, Provider]
    mcp: dict[str, LocalMcpServer] | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


def output_tokens(context_length: int) -> int:
    """A reply's budget: a quarter of the context, at most LONGEST_OUTPUT_TOKENS."""
    return max(1, min(LONGEST_OUTPUT_TOKENS, context_length // 4))


def opencode_config(target: LaunchTarget) -> OpencodeConfig:
    limit = (
        None
        if target.context_length is None
        else ModelLimit(context=target.context_length, output=output_tokens(target.context_length))
    )
    options = ProviderOptions(
        base_url=target.openai_url,
        api_key=f"{{env:{API_KEY_VARIABLE}}}" if target.api_key else None,
        headers={LOOP_GUARD_HEADER: target.loop_guard} if target.loop_guard else None,
    )
    qualified = f"{EXO_NAME}/{target.model}"
    mcp = (
        None if target.mcp is None else {EXO_NAME: LocalMcpServer(command=(target.mcp.command, *target.mcp.arguments))}
    )
    return OpencodeConfig(
        model=qualified,
        small_model=qualified,
        provider={
            EXO_NAME: Provider(
                options=options, models={target.model: ProviderModel(name=f"{target.model} (exo)", limit=limit)}
            )
        },
        mcp=mcp,
    )


def plan(target: LaunchTarget, folder: Path) -> ClientPlan:
    """The configuration file in `folder`, named to opencode by OPENCODE_CONFIG."""
    content = opencode_config(target).to_json()
    path = content_addressed(folder, "opencode", ".json", content)
    environment = {CONFIG_VARIABLE: str(path)}
    if target.api_key:
        environment[API_KEY_VARIABLE] = target.api_key
    return ClientPlan(files={path: content}, environment=environment)
