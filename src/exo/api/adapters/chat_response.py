"""Chunks → one non-streaming `chat.completion` response (the same chunks the stream would carry)."""

from collections.abc import AsyncIterator

from exo.api.errors import ApiError, task_error
from exo.api.types.openai_chat import (
    ChatCompletionResponse,
    Choice,
    CompletionTokensDetails,
    PromptTokensDetails,
    ResponseFunctionCall,
    ResponseMessage,
    ResponseToolCall,
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
)


class ChatAnswer:
    """The non-streaming `chat.completion` the chunks add up to, built a chunk at a time."""

    def __init__(self, *, completion_id: str, created: int, model: str) -> None:
        self._completion_id = completion_id
        self._created = created
        self._model = model
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._finish: FinishChunk | None = None

    def add(self, chunk: Chunk) -> None:
        """Take one chunk in (an ErrorChunk is the caller's to raise: the answer has no error field)."""
        match chunk:
            case TokenChunk(text=text):
                self._content.append(text)
            case ReasoningChunk(text=text):
                self._reasoning.append(text)
            case ToolCallChunk(index=index, call_id=call_id, name=name):
                self._calls[index] = (call_id, name, [])
            case ToolCallArgumentsChunk(index=index, fragment=fragment):
                self._calls[index][2].append(fragment)
            case FinishChunk():
                self._finish = chunk
            case ErrorChunk() | PrefillProgressChunk():
                pass  # not content

    def response(self) -> ChatCompletionResponse:
        """The answer, once the FinishChunk is in."""
        finish = self._finish
        if finish is None:
            raise ApiError(500, "generation ended without a result", error_type="server_error")
        tool_calls = [
            ResponseToolCall(id=call_id, function=ResponseFunctionCall(name=name, arguments="".join(fragments)))
            for _, (call_id, name, fragments) in sorted(self._calls.items())
        ]
        text = "".join(self._content)
        message = ResponseMessage(
            content=None if tool_calls and not text else text,
            reasoning_content="".join(self._reasoning) or None,
            tool_calls=tool_calls or None,
        )
        usage = finish.usage
        return ChatCompletionResponse(
            id=self._completion_id,
            created=self._created,
            model=self._model,
            choices=[Choice(message=message, finish_reason=finish.finish_reason)],
            usage=ResponseUsage(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                total_tokens=usage.total_tokens,
                prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
                completion_tokens_details=CompletionTokensDetails(reasoning_tokens=usage.reasoning_tokens),
                withdrawn_tool_calls=usage.withdrawn_tool_calls,
            ),
            exo_loop_warnings=list(finish.loop_warnings) or None,
        )


async def collect_response(
    chunks: AsyncIterator[Chunk], *, completion_id: str, created: int, model: str
) -> ChatCompletionResponse:
    """Accumulate every chunk; an ErrorChunk becomes an ApiError with its status code."""
    answer = ChatAnswer(completion_id=completion_id, created=created, model=model)
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            raise task_error(chunk)
        answer.add(chunk)
    return answer.response()
