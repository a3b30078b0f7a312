"""OpenAI Responses API streaming events (`event: <type>` + `data: <json>`), numbered by `sequence_number`."""

from typing import Literal

from pydantic import BaseModel, Field

from exo.api.types.openai_responses_output import OutputItem, OutputText, ReasoningText, ResponseObject


class ResponseLifecycleEvent(BaseModel):
    """response.created / in_progress / completed / incomplete / failed: the whole response at that moment."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"
    ]
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(BaseModel):
    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(BaseModel):
    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText = Field(discriminator="type")


class TextDeltaEvent(BaseModel):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    # Always empty: logprobs are not supported.
    logprobs: list[object] = Field(default_factory=list)


class TextDoneEvent(BaseModel):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[object] = Field(default_factory=list)


class ReasoningDeltaEvent(BaseModel):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDoneEvent(BaseModel):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDeltaEvent(BaseModel):
    """A fragment of a function call's arguments; the fragments concatenate to the whole JSON text."""

    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(BaseModel):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


ResponseStreamEvent = (
    ResponseLifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | TextDeltaEvent
    | TextDoneEvent
    | ReasoningDeltaEvent
    | ReasoningDoneEvent
    | ArgumentsDeltaEvent
    | ArgumentsDoneEvent
)
