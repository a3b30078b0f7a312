"""Anthropic Messages API wire types (`POST /v1/messages`, `/v1/messages/count_tokens`): requests and answers.

Requests are validated here and nowhere else; `exo.api.adapters.messages_request` turns them into the same
command a chat completion becomes. Content blocks the server cannot use (images, documents, server-tool blocks)
are still recognised by their `type`, so the adapter can refuse them with a 400 that names them.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from exo.api.types.wire import Integer, WireModel
from exo.shared.types.api import JsonObject

# ---- request: content blocks -----------------------------------------------------------------


class TextBlockParam(WireModel):
    type: Literal["text"]
    text: str


class ThinkingBlockParam(WireModel):
    """Reasoning from an earlier turn; `signature` is Anthropic's and means nothing here, so it is not checked."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class ToolUseBlockParam(WireModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: JsonObject


class ToolResultBlockParam(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: "str | list[ContentBlockParam] | None" = None
    is_error: bool | None = None


class OtherBlockParam(WireModel):
    """Any other block (image, document, redacted_thinking, server tool blocks…): refused by the adapter."""

    type: str


_KNOWN_BLOCK_TYPES = frozenset({"text", "thinking", "tool_use", "tool_result"})


def _block_tag(value: object) -> str:
    block_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return block_type if isinstance(block_type, str) and block_type in _KNOWN_BLOCK_TYPES else "other"


ContentBlockParam = Annotated[
    Annotated[TextBlockParam, Tag("text")]
    | Annotated[ThinkingBlockParam, Tag("thinking")]
    | Annotated[ToolUseBlockParam, Tag("tool_use")]
    | Annotated[ToolResultBlockParam, Tag("tool_result")]
    | Annotated[OtherBlockParam, Tag("other")],
    Discriminator(_block_tag),
]


ToolResultBlockParam.model_rebuild()


class MessageParam(WireModel):
    """One turn. `system` turns inside `messages` are Anthropic's mid-conversation system messages."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlockParam]


# ---- request: tools and controls -------------------------------------------------------------


class ToolParam(WireModel):
    """A client tool (`type` absent or "custom"); any other `type` is a server tool, refused by the adapter."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: JsonObject | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    input_examples: list[JsonObject] | None = None
    eager_input_streaming: bool | None = None
    allowed_callers: list[str] | None = None


class ToolChoiceAuto(WireModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(WireModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(WireModel):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(WireModel):
    type: Literal["none"]


ToolChoiceParam = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class ThinkingConfigParam(WireModel):
    """`enabled` (with `budget_tokens`), `adaptive`, `between_tools` or `disabled`."""

    type: Literal["enabled", "adaptive", "between_tools", "disabled"]
    budget_tokens: Integer | None = None
    display: str | None = None


class JsonOutputFormat(WireModel):
    type: Literal["json_schema"]
    # `schema` would shadow a BaseModel attribute, so the field reads the wire key by alias.
    schema_: JsonObject = Field(alias="schema")


class OutputConfigParam(WireModel):
    effort: str | None = None
    format: JsonOutputFormat | None = None


class ThinkingTurns(WireModel):
    type: Literal["thinking_turns", "all"]
    value: Integer | None = None


class ContextEdit(WireModel):
    """One `context_management.edits[]` entry; only `clear_thinking_20251015` is applied, others are refused."""

    type: str
    keep: Literal["all"] | ThinkingTurns | JsonObject | None = None


class ContextManagementParam(WireModel):
    edits: list[ContextEdit] = Field(default_factory=list)


# ---- requests --------------------------------------------------------------------------------


class MessagesPrompt(WireModel):
    """What determines the prompt: shared by `/v1/messages` and `/v1/messages/count_tokens`.

    Top-level fields are a closed set, as for chat completions: an undeclared field is a 400 naming it. Scalars
    are strict. Fields declared but not acted on are listed in `exo.api.adapters.messages_request`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    messages: list[MessageParam]
    system: str | list[ContentBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingConfigParam | None = None
    output_config: OutputConfigParam | None = None
    context_management: ContextManagementParam | None = None
    cache_control: JsonObject | None = None
    speed: str | None = None
    mcp_servers: list[JsonObject] | None = None


class MessagesRequest(MessagesPrompt):
    """The body of POST /v1/messages."""

    max_tokens: Integer
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Integer | None = Field(default=None, ge=0)
    metadata: JsonObject | None = None
    service_tier: str | None = None
    container: str | JsonObject | None = None
    inference_geo: str | None = None
    diagnostics: JsonObject | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class CountTokensRequest(MessagesPrompt):
    """The body of POST /v1/messages/count_tokens."""


# ---- answers ---------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str
    citations: None = None


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    # Anthropic signs its own thinking; a local model's has nothing to sign.
    signature: str = ""


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: JsonObject


ContentBlock = Annotated[TextContent | ThinkingContent | ToolUseContent, Field(discriminator="type")]


class MessageUsage(BaseModel):
    """Anthropic counts the prompt in three parts: `input_tokens` excludes what was read from the cache."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    # exo's own: how many calls the agent-loop guard withdrew from this answer (docs/TOOL_CALLING.md); absent at 0.
    withdrawn_tool_calls: int = Field(default=0, exclude_if=lambda count: count == 0)


class AnthropicMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: MessageUsage
    # exo's own: what the agent-loop guard found (docs/TOOL_CALLING.md); absent when it found nothing.
    exo_loop_warnings: list[str] | None = Field(default=None, exclude_if=lambda warnings: not warnings)


class TokenCount(BaseModel):
    """The answer of /v1/messages/count_tokens."""

    input_tokens: int


AnthropicErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
]


class AnthropicErrorBody(BaseModel):
    type: AnthropicErrorType
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"] = "error"
    error: AnthropicErrorBody
