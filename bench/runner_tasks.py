"""Runner tasks from OpenAI request bodies, for the benches that drive the runner's scheduler in-process."""

from collections.abc import Mapping

from exo.api.adapters.chat_request import to_command
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.shared.types.common import ModelId, new_task_id
from exo.shared.types.tasks import GenerationTask


def generation_task(body: Mapping[str, object], model: str) -> GenerationTask:
    """The task the API would hand a runner for chat request `body` to `model` (validated by its own adapter)."""
    command = to_command(ChatCompletionRequest.model_validate({**body, "model": model}), ModelId(model))
    return GenerationTask(
        task_id=new_task_id(), command_id=command.command_id, model_id=command.model_id, params=command.params
    )
