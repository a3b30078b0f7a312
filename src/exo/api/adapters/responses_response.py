"""The response object for a Responses request: created from the request's settings, completed from the chunks.

The non-streaming answer is the fold of the very events the stream would carry (see responses_stream).
"""

import time
from collections.abc import AsyncIterator

from exo.api.adapters.protocol_events import NamedEventWriter, fold
from exo.api.adapters.responses_stream import ResponseStreamEncoder
from exo.api.types.openai_responses import ResponsesRequest
from exo.api.types.openai_responses_output import ResponseObject
from exo.shared.types.chunks import Chunk


def initial_response(request: ResponsesRequest, response_id: str, model: str) -> ResponseObject:
    """The response as created: in progress, no output, the request's settings echoed as OpenAI does."""
    tool_choice = request.tool_choice or "auto"
    text = request.text.model_dump(by_alias=True, exclude_none=True) if request.text else {"format": {"type": "text"}}
    return ResponseObject(
        id=response_id,
        created_at=int(time.time()),
        status="in_progress",
        model=model,
        output=[],
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        temperature=request.temperature if request.temperature is not None else 0.0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        tool_choice=tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(by_alias=True),
        tools=[tool.model_dump(by_alias=True, exclude_none=True) for tool in request.tools or []],
        text=text,
        reasoning=request.reasoning.model_dump(exclude_none=True) if request.reasoning else None,
        metadata=request.metadata or {},
        user=request.user,
    )


async def collect_response(chunks: AsyncIterator[Chunk], initial: ResponseObject) -> ResponseObject:
    """Encode every chunk and return the finished response; an ErrorChunk becomes an ApiError with its status."""
    encoder = ResponseStreamEncoder(initial)
    await fold(chunks, NamedEventWriter(encoder))
    return encoder.response()
