"""OpenAI Chat Completions' wire types: the body clients POST to /v1/chat/completions, and the answer we send
back (streamed chunks are written by exo.api.adapters.chat_stream)."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from exo.api.types.wire import MAX_STOP_SEQUENCES, Integer, Seed, StopSequence, WireModel
from exo.shared.types.api import JsonObject
from exo.shared.types.common import FinishReason
from exo.shared.types.tool_spec import ToolSpec


class TextContentPart(WireModel):
    type: Literal["text"]
    text: str


class OtherContentPart(WireModel):
    """Non-text parts (images, audio…): accepted in the schema, rejected with a clear 400 by validation."""

    type: str


ContentPart = TextContentPart | OtherContentPart


class FunctionCall(WireModel):
    name: str
    # Clients send a JSON string (OpenAI) but some send the object itself; both are accepted.
    arguments: str | JsonObject = ""


class ToolCall(WireModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(WireModel):
    name: str
    description: str | None = None
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    def tool_spec(self) -> ToolSpec:
        """The engine's form of this tool, the keys a client added kept (the prompt shows them)."""
        return ToolSpec.model_validate(self.model_dump())


class ToolDefinition(WireModel):
    type: str = "function"
    function: FunctionDefinition


class NamedFunction(WireModel):
    name: str


class NamedToolChoice(WireModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedToolsSpec(WireModel):
    mode: Literal["auto", "required"]
    tools: list[JsonObject]


class AllowedToolsChoice(WireModel):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedToolsSpec


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class StreamOptions(WireModel):
    include_usage: bool = False


class TextResponseFormat(WireModel):
    """Free text: the default, nothing is constrained."""

    type: Literal["text"]


class JsonObjectResponseFormat(WireModel):
    """JSON mode: the reply's content is one JSON object, of any shape."""

    type: Literal["json_object"]


class JsonSchemaSpec(WireModel):
    """Structured outputs: the reply's content is JSON valid against `schema` (enforced whatever `strict` says)."""

    name: str
    description: str | None = None
    # `schema` would shadow a BaseModel attribute, so the field has another name and reads the wire key by alias.
    schema_: JsonObject = Field(alias="schema")
    strict: bool | None = None


class JsonSchemaResponseFormat(WireModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextResponseFormat | JsonObjectResponseFormat | JsonSchemaResponseFormat, Field(discriminator="type")
]


class ChatCompletionRequest(WireModel):
    """The body of POST /v1/chat/completions.

    Top-level fields are a closed set: a field not declared here is rejected with OpenAI's "Unrecognized request
    argument supplied" 400, so typos (`max_token`) fail loudly instead of being silently dropped. Besides OpenAI's
    own fields, a deliberate allow-list of extensions that common clients send (vLLM / llama.cpp / mlx-lm sampling
    knobs, opencode's and the AI SDK's extras) is declared and typed; `IGNORED_REQUEST_FIELDS` in
    `exo.api.adapters.chat_request` names those accepted but not acted on. Scalars are strict (`"5"` is not an
    integer, `"yes"` is not a boolean). Nested objects stay open: clients attach metadata such as `cache_control`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Integer | None = Field(default=None, ge=1)
    max_completion_tokens: Integer | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: Seed | None = None
    stop: StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    # Only 1 is supported; the check in the adapter says so in words, the schema states the range.
    n: Integer | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": 1})
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Integer | None = Field(default=None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    # 0 or -1: no limit. Must be below the model's vocabulary size (`vocab_size` in GET /v1/models).
    top_k: Integer | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    chat_template_kwargs: JsonObject | None = None
    # exo's own: under tool_choice "auto", hold an opened call to the tools' schemas (None: the node's setting).
    auto_tool_grammar: bool | None = None
    # exo's own: the agent-loop guard for this request, "off" | "warn" | "block" | "answer" (None: the node's setting).
    loop_guard: Literal["off", "warn", "block", "answer"] | None = None
    # exo's own: under tool_choice "auto", re-decode once under the grammar a call that no grammar held and that
    # failed to parse or validate (None: the node's setting).
    tool_call_repair: bool | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


# ---- responses -------------------------------------------------------------------------------


class ResponseFunctionCall(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails
    # exo's own: how many calls the agent-loop guard withdrew from this answer (docs/TOOL_CALLING.md); absent at 0.
    withdrawn_tool_calls: int = Field(default=0, exclude_if=lambda count: count == 0)


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: ResponseUsage
    # exo's own: what the agent-loop guard found (repeated calls, ping-pong); null when it found nothing.
    exo_loop_warnings: list[str] | None = None
