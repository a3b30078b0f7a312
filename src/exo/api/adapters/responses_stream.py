"""Chunks → OpenAI Responses stream events, and the response they add up to.

One output item is open at a time, in the order the model wrote them: a reasoning item, a message item, one
function_call item per call (text after a call opens a new message item). Each item is announced
(`output_item.added`), streamed (text deltas or `function_call_arguments.delta` fragments exactly as the runner
parsed them) and closed (`…done` events with the full text, then `output_item.done`). The last event,
`response.completed` (or `response.incomplete` at max_output_tokens, `response.failed` on an error), carries the
whole response, which is also the non-streaming answer: both are the same fold of the same chunks.
"""

from typing import Literal
from uuid import uuid4

from exo.api.types.openai_responses_events import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ContentPartEvent,
    OutputItemEvent,
    ReasoningDeltaEvent,
    ReasoningDoneEvent,
    ResponseLifecycleEvent,
    ResponseStreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from exo.api.types.openai_responses_output import (
    FunctionCallOutput,
    IncompleteDetails,
    InputTokensDetails,
    ItemStatus,
    MessageOutput,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningOutput,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)
from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    PrefillProgressChunk,
    ReasoningChunk,
    TokenChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
)

ItemKind = Literal["reasoning", "message", "function_call"]
_ID_PREFIX: dict[ItemKind, str] = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


class _Item:
    """An output item being written: its text (or arguments) so far."""

    __slots__ = ("call_id", "item_id", "kind", "name", "output_index", "parts", "status")

    def __init__(self, kind: ItemKind, output_index: int, call_id: str = "", name: str = "") -> None:
        self.kind: ItemKind = kind
        self.item_id = f"{_ID_PREFIX[kind]}_{uuid4().hex}"
        self.output_index = output_index
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []
        self.status: ItemStatus = "in_progress"

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def output(self, *, announced: bool = False) -> OutputItem:
        """The item as it is now; `announced` is its empty form for `output_item.added`."""
        text = "" if announced else self.text
        match self.kind:
            case "message":
                content = [] if announced else [OutputText(text=text)]
                return MessageOutput(id=self.item_id, status=self.status, content=content)
            case "reasoning":
                reasoning = [] if announced else [ReasoningText(text=text)]
                return ReasoningOutput(id=self.item_id, status=self.status, content=reasoning)
            case "function_call":
                return FunctionCallOutput(
                    id=self.item_id, call_id=self.call_id, name=self.name, arguments=text, status=self.status
                )


def response_usage(usage: Usage) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens),
        total_tokens=usage.total_tokens,
        withdrawn_tool_calls=usage.withdrawn_tool_calls,
    )


class ResponseStreamEncoder:
    """Encodes one response's chunks as stream events and keeps the response they describe.

    `initial` is the response as created: its id, model and the request's settings, no output yet.
    """

    def __init__(self, initial: ResponseObject) -> None:
        self._response = initial
        self._items: list[_Item] = []
        self._open: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._sequence = 0

    def whole(self) -> ResponseObject:
        return self.response()

    def response(self) -> ResponseObject:
        """The response as the events so far describe it (final after the FinishChunk or ErrorChunk)."""
        return self._response.model_copy(update={"output": [item.output() for item in self._items]})

    def start(self) -> list[ResponseStreamEvent]:
        """response.created and response.in_progress, carrying the response as created."""
        return [self._lifecycle("response.created"), self._lifecycle("response.in_progress")]

    def keep_alive(self) -> list[ResponseStreamEvent]:
        """response.in_progress again, the response as it stands: the keep-alive of a stream still waiting."""
        return [self._lifecycle("response.in_progress")]

    def encode(self, chunk: Chunk) -> list[ResponseStreamEvent]:
        match chunk:
            case TokenChunk(text=text) if text:
                return self._append("message", text)
            case ReasoningChunk(text=text) if text:
                return self._append("reasoning", text)
            case ToolCallChunk(index=index, call_id=call_id, name=name):
                item = _Item("function_call", len(self._items), call_id, name)
                self._calls[index] = item
                return [*self._close("completed"), *self._open_item(item)]
            case ToolCallArgumentsChunk(index=index, fragment=fragment) if fragment:
                item = self._calls[index]
                if item is not self._open:
                    raise ValueError(f"arguments for tool call {index} arrived after its item was closed")
                item.parts.append(fragment)
                delta = ArgumentsDeltaEvent(
                    sequence_number=self._next(), item_id=item.item_id, output_index=item.output_index, delta=fragment
                )
                return [delta]
            case FinishChunk(finish_reason=reason, usage=usage, loop_warnings=warnings):
                truncated = reason == "length"
                events = self._close("incomplete" if truncated else "completed")
                self._response = self._response.model_copy(
                    update={
                        "status": "incomplete" if truncated else "completed",
                        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if truncated else None,
                        "usage": response_usage(usage),
                        "exo_loop_warnings": list(warnings) or None,
                    }
                )
                return [*events, self._lifecycle("response.incomplete" if truncated else "response.completed")]
            case ErrorChunk(message=message):
                events = self._close("incomplete")
                error = ResponseError(message=message)
                self._response = self._response.model_copy(update={"status": "failed", "error": error})
                return [*events, self._lifecycle("response.failed")]
            case PrefillProgressChunk():
                return []  # not content: the keep-alive comments carry it (completion_flow.py)
            case _:
                return []  # an empty text or argument fragment

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def _lifecycle(
        self,
        kind: Literal[
            "response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"
        ],
    ) -> ResponseLifecycleEvent:
        return ResponseLifecycleEvent(type=kind, sequence_number=self._next(), response=self.response())

    def _append(self, kind: Literal["message", "reasoning"], text: str) -> list[ResponseStreamEvent]:
        events: list[ResponseStreamEvent] = []
        if self._open is None or self._open.kind != kind:
            events = [*self._close("completed"), *self._open_item(_Item(kind, len(self._items)))]
        item = self._open
        assert item is not None
        item.parts.append(text)
        delta_event = TextDeltaEvent if kind == "message" else ReasoningDeltaEvent
        events.append(
            delta_event(
                sequence_number=self._next(),
                item_id=item.item_id,
                output_index=item.output_index,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _open_item(self, item: _Item) -> list[ResponseStreamEvent]:
        self._items.append(item)
        self._open = item
        events: list[ResponseStreamEvent] = [
            OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self._next(),
                output_index=item.output_index,
                item=item.output(announced=True),
            )
        ]
        if item.kind != "function_call":
            part = OutputText(text="") if item.kind == "message" else ReasoningText(text="")
            events.append(self._part_event("response.content_part.added", item, part))
        return events

    def _part_event(
        self,
        kind: Literal["response.content_part.added", "response.content_part.done"],
        item: _Item,
        part: OutputText | ReasoningText,
    ) -> ContentPartEvent:
        return ContentPartEvent(
            type=kind,
            sequence_number=self._next(),
            item_id=item.item_id,
            output_index=item.output_index,
            content_index=0,
            part=part,
        )

    def _close(self, status: ItemStatus) -> list[ResponseStreamEvent]:
        item = self._open
        if item is None:
            return []
        self._open = None
        item.status = status
        text = item.text
        events: list[ResponseStreamEvent] = []
        match item.kind:
            case "message" | "reasoning":
                done_event = TextDoneEvent if item.kind == "message" else ReasoningDoneEvent
                part = OutputText(text=text) if item.kind == "message" else ReasoningText(text=text)
                events.append(
                    done_event(
                        sequence_number=self._next(),
                        item_id=item.item_id,
                        output_index=item.output_index,
                        content_index=0,
                        text=text,
                    )
                )
                events.append(self._part_event("response.content_part.done", item, part))
            case "function_call":
                events.append(
                    ArgumentsDoneEvent(
                        sequence_number=self._next(),
                        item_id=item.item_id,
                        output_index=item.output_index,
                        name=item.name,
                        arguments=text,
                    )
                )
        done = OutputItemEvent(
            type="response.output_item.done",
            sequence_number=self._next(),
            output_index=item.output_index,
            item=item.output(),
        )
        return [*events, done]
