"""OpenAI Responses API answers: the response object, its output items and usage, and the streaming events.

A response's `output` is a list of items in the order the model wrote them: a `reasoning` item, a `message` item
with `output_text`, one `function_call` item per tool call. The stream announces each item (`output_item.added`),
streams its text or arguments, and closes it (`output_item.done`); `response.completed` carries the whole response.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from exo.shared.types.api import JsonObject

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[JsonObject] = Field(default_factory=list)
    logprobs: list[JsonObject] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageOutput(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class ReasoningOutput(BaseModel):
    """The model's reasoning, as plain text: a local model's reasoning is neither summarised nor encrypted."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    status: ItemStatus
    summary: list[JsonObject] = Field(default_factory=list)
    content: list[ReasoningText]
    encrypted_content: None = None


class FunctionCallOutput(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = Annotated[MessageOutput | ReasoningOutput | FunctionCallOutput, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int
    # Written to a billed cache; exo's prefix cache costs nothing to fill.
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    # exo's own: how many calls the agent-loop guard withdrew from this answer (docs/TOOL_CALLING.md); absent at 0.
    withdrawn_tool_calls: int = Field(default=0, exclude_if=lambda count: count == 0)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: Literal["server_error"] = "server_error"
    message: str


class ResponseObject(BaseModel):
    """The response, as `POST /v1/responses` returns it and `response.*` lifecycle events carry it."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    # The request's settings, echoed as OpenAI does.
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: str | JsonObject = "auto"
    tools: list[JsonObject] = Field(default_factory=list)
    text: JsonObject = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: JsonObject | None = None
    truncation: Literal["disabled"] = "disabled"
    store: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    # exo's own: what the agent-loop guard found (docs/TOOL_CALLING.md); absent when it found nothing.
    exo_loop_warnings: list[str] | None = Field(default=None, exclude_if=lambda warnings: not warnings)


class InputTokenCount(BaseModel):
    """The answer of /v1/responses/input_tokens."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
