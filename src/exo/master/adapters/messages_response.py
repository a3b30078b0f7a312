"""Chunks → one non-streaming Anthropic message: the fold of the very events the stream would carry."""

from collections.abc import AsyncIterator

from exo.master.adapters.messages_stream import MessageStreamEncoder
from exo.master.errors import ApiError, task_error
from exo.shared.types.anthropic_messages import AnthropicMessage
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk


async def collect_message(chunks: AsyncIterator[Chunk], *, message_id: str, model: str) -> AnthropicMessage:
    """Encode every chunk and return the finished message; an ErrorChunk becomes an ApiError with its status."""
    encoder = MessageStreamEncoder(message_id, model)
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            raise task_error(chunk)
        encoder.encode(chunk)
        if isinstance(chunk, FinishChunk):
            return encoder.message()
    raise ApiError(500, "generation ended without a result", error_type="server_error")
