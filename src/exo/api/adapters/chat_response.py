"""Chunks → one non-streaming `chat.completion` response (the same chunks the stream would carry)."""

from collections.abc import AsyncIterator

from exo.api.errors import ApiError, task_error
from exo.shared.types.api import (
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


async def collect_response(
    chunks: AsyncIterator[Chunk], *, completion_id: str, created: int, model: str
) -> ChatCompletionResponse:
    """Accumulate every chunk; an ErrorChunk becomes an ApiError with its status code."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, tuple[str, str, list[str]]] = {}
    finish: FinishChunk | None = None
    async for chunk in chunks:
        match chunk:
            case TokenChunk(text=text):
                content.append(text)
            case ReasoningChunk(text=text):
                reasoning.append(text)
            case ToolCallChunk(index=index, call_id=call_id, name=name):
                calls[index] = (call_id, name, [])
            case ToolCallArgumentsChunk(index=index, fragment=fragment):
                calls[index][2].append(fragment)
            case FinishChunk():
                finish = chunk
            case ErrorChunk():
                raise task_error(chunk)
            case PrefillProgressChunk():
                pass  # not content
    if finish is None:
        raise ApiError(500, "generation ended without a result", error_type="server_error")
    tool_calls = [
        ResponseToolCall(id=call_id, function=ResponseFunctionCall(name=name, arguments="".join(fragments)))
        for _, (call_id, name, fragments) in sorted(calls.items())
    ]
    text = "".join(content)
    message = ResponseMessage(
        content=None if tool_calls and not text else text,
        reasoning_content="".join(reasoning) or None,
        tool_calls=tool_calls or None,
    )
    usage = finish.usage
    return ChatCompletionResponse(
        id=completion_id,
        created=created,
        model=model,
        choices=[Choice(message=message, finish_reason=finish.finish_reason)],
        usage=ResponseUsage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
            completion_tokens_details=CompletionTokensDetails(reasoning_tokens=usage.reasoning_tokens),
        ),
        exo_loop_warnings=list(finish.loop_warnings) or None,
    )
