"""Token counting: a count-only command, and the count its task reports (the prompt rendered and tokenised on the
model's runner, with the model's own template and tokenizer, exactly as a completion's prompt is)."""

from collections.abc import AsyncIterator

from exo.api.errors import ApiError, task_error
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId, new_command_id
from exo.shared.types.tasks import GenerationParams


def count_command(params: GenerationParams, model_id: ModelId) -> GenerateCommand:
    """The command whose task renders `params`' prompt and reports its length, generating nothing."""
    counting = params.model_copy(update={"count_prompt_only": True})
    return GenerateCommand(command_id=new_command_id(), model_id=model_id, params=counting)


async def collect_prompt_tokens(chunks: AsyncIterator[Chunk]) -> int:
    """The `prompt_tokens` a count-only task reports; an ErrorChunk becomes an ApiError with its status."""
    async for chunk in chunks:
        match chunk:
            case FinishChunk(usage=usage):
                return usage.prompt_tokens
            case ErrorChunk():
                raise task_error(chunk)
            case _:
                pass  # a count-only task sends no content; a progress chunk is not the count
    raise ApiError(500, "token counting ended without a result", error_type="server_error")
