"""OpenAI Responses API request types (`POST /v1/responses`, `/v1/responses/input_tokens`).

Validated here and nowhere else; `exo.api.adapters.responses_request` turns a request into the same command a
chat completion becomes. Input items, content parts, tools and tool choices the server cannot use (images, files,
hosted tools, item references…) are still recognised by their `type`, so the adapter can refuse them by name.
"""

from typing import Annotated, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from exo.api.types.wire import Integer, WireModel
from exo.shared.types.api import JsonObject


def _tagged(known: frozenset[str], default_type: str | None = None) -> Discriminator:
    """A discriminator reading `type` (or `default_type` when absent); unknown types go to the "other" member."""

    def tag(value: object) -> str:
        kind = value.get("type", default_type) if isinstance(value, dict) else getattr(value, "type", default_type)
        return kind if isinstance(kind, str) and kind in known else "other"

    return Discriminator(tag)


class OtherEntry(WireModel):
    """An input item, content part, tool or tool choice of a type this server does not serve."""

    type: str | None = None


# ---- content parts ---------------------------------------------------------------------------


class InputTextPart(WireModel):
    type: Literal["input_text"]
    text: str


class OutputTextPart(WireModel):
    type: Literal["output_text"]
    text: str


class RefusalPart(WireModel):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[
    Annotated[InputTextPart, Tag("input_text")]
    | Annotated[OutputTextPart, Tag("output_text")]
    | Annotated[RefusalPart, Tag("refusal")]
    | Annotated[OtherEntry, Tag("other")],
    _tagged(frozenset({"input_text", "output_text", "refusal"})),
]


# ---- input items -----------------------------------------------------------------------------


class MessageItem(WireModel):
    """A message; `type` may be left out (the SDK's "easy" input messages)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(WireModel):
    """A call the model made earlier, sent back as history."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class ReasoningText(WireModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(WireModel):
    """Reasoning from an earlier turn: its text goes back to the model as that turn's reasoning."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[OtherEntry, Tag("other")],
    _tagged(frozenset({"message", "function_call", "function_call_output", "reasoning"}), default_type="message"),
]


# ---- tools and controls ----------------------------------------------------------------------


class FunctionTool(WireModel):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: JsonObject | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[OtherEntry, Tag("other")],
    _tagged(frozenset({"function"})),
]


class FunctionToolChoice(WireModel):
    type: Literal["function"]
    name: str


class AllowedToolsChoice(WireModel):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[JsonObject]


ToolChoice = (
    Literal["none", "auto", "required"]
    | Annotated[
        Annotated[FunctionToolChoice, Tag("function")]
        | Annotated[AllowedToolsChoice, Tag("allowed_tools")]
        | Annotated[OtherEntry, Tag("other")],
        _tagged(frozenset({"function", "allowed_tools"})),
    ]
)


class TextFormat(WireModel):
    """`text.format`: "text", "json_object", or "json_schema" with `name`, `schema` and `strict`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    # `schema` would shadow a BaseModel attribute, so the field reads the wire key by alias.
    schema_: JsonObject | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(WireModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(WireModel):
    effort: str | None = None
    summary: str | None = None


# ---- requests --------------------------------------------------------------------------------


class ResponsesPrompt(WireModel):
    """What determines the prompt: shared by `/v1/responses` and `/v1/responses/input_tokens`.

    Top-level fields are a closed set, as for chat completions: an undeclared field is a 400 naming it. Fields
    declared only to be refused (server-side state, background runs…) get a 400 that says why.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    previous_response_id: str | None = None
    conversation: str | JsonObject | None = None


class ResponsesRequest(ResponsesPrompt):
    """The body of POST /v1/responses."""

    stream: bool | None = None
    stream_options: JsonObject | None = None
    max_output_tokens: Integer | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: Integer | None = Field(default=None, ge=0, le=20)
    include: list[str] | None = None
    store: bool | None = None
    background: bool | None = None
    max_tool_calls: Integer | None = None
    prompt: JsonObject | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    # Codex CLI sends its session identifiers here.
    client_metadata: JsonObject | None = None


class InputTokensRequest(ResponsesPrompt):
    """The body of POST /v1/responses/input_tokens."""
