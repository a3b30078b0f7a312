"""Chunks → one non-streaming Anthropic message: the fold of the very events the stream would carry."""

from collections.abc import AsyncIterator

from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.protocol_events import NamedEventWriter, fold
from exo.api.types.anthropic_messages import AnthropicMessage
from exo.shared.types.chunks import Chunk


async def collect_message(chunks: AsyncIterator[Chunk], *, message_id: str, model: str) -> AnthropicMessage:
    """Encode every chunk and return the finished message; an ErrorChunk becomes an ApiError with its status."""
    encoder = MessageStreamEncoder(message_id, model)
    await fold(chunks, NamedEventWriter(encoder))
    return encoder.message()
