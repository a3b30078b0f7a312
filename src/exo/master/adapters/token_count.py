"""Chunks of a count-only task → the prompt's token count (rendered and tokenised on the model's runner)."""

from collections.abc import AsyncIterator

from exo.master.errors import ApiError, task_error
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk


async def collect_prompt_tokens(chunks: AsyncIterator[Chunk]) -> int:
    """The `prompt_tokens` a count-only task reports; an ErrorChunk becomes an ApiError with its status."""
    async for chunk in chunks:
        match chunk:
            case FinishChunk(usage=usage):
                return usage.prompt_tokens
            case ErrorChunk():
                raise task_error(chunk)
            case _:
                pass
    raise ApiError(500, "token counting ended without a result", error_type="server_error")
