"""exo_run_model: one chat completion through the node's own OpenAI-compatible API, timed."""

import time

from pydantic import Field

from exo.mcp.chat_wire import ChatRequest, ResponseToolCall, UserMessage
from exo.mcp.failures import ToolFailedError
from exo.mcp.memory import memory_fit, require_fit
from exo.mcp.node_client import NodeApiError, NodeClient
from exo.shared.types.common import FinishReason, FrozenModel

DEFAULT_MAX_TOKENS = 256


class RunResult(FrozenModel):
    """What the model answered, and how long it took."""

    model: str
    content: str | None = Field(description="the answer text (None when the model only called tools)")
    tool_calls: list[ResponseToolCall] = Field(default_factory=list[ResponseToolCall])
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    seconds: float = Field(description="wall time of the request, queueing included")
    tokens_per_second: float = Field(description="completion tokens per second of wall time")

    def describe(self) -> str:
        """The answer, then one line of figures."""
        calls = "".join(f"\n[tool call] {call.function.name}({call.function.arguments})" for call in self.tool_calls)
        return (
            f"{self.content or ''}{calls}\n\n"
            f"({self.model}: {self.completion_tokens} tokens in {self.seconds:.1f}s, "
            f"{self.tokens_per_second:.1f} tokens/s, {self.prompt_tokens} prompt tokens, "
            f"finish reason {self.finish_reason})"
        ).strip()


async def _explain_not_served(client: NodeClient, model: str, error: NodeApiError) -> None:
    """Why `model` cannot run: too large for the cluster (with the numbers), not started yet, or unknown."""
    catalog = await client.catalog()
    listed = next((entry for entry in catalog.models if entry.listing.entry.model_id == model), None)
    if listed is None:
        raise ToolFailedError(f"{error} Call exo_list_models to see what exo serves and can fetch.") from error
    fit = memory_fit(listed, await client.cluster())
    require_fit(fit)
    step = "start" if listed.listing.downloaded else "fetch it with exo_download_model, then start"
    raise ToolFailedError(
        f"{model} is in exo's catalog but not running; {step} it with `exo --model {model}`. {fit.describe()}.",
        partial=fit,
    ) from error


async def run_model(
    client: NodeClient, model: str, prompt: str, temperature: float | None, max_tokens: int
) -> RunResult:
    """Send `prompt` as one user message to `model` and wait for the whole answer."""
    request = ChatRequest(
        model=model,
        messages=[UserMessage(content=prompt)],
        temperature=temperature,
        max_tokens=max_tokens,
    )
    started = time.monotonic()
    try:
        response = await client.chat_completion(request)
    except NodeApiError as error:
        if error.code == "model_not_found":
            await _explain_not_served(client, model, error)
        raise
    seconds = time.monotonic() - started
    choice = response.choices[0]
    usage = response.usage
    return RunResult(
        model=response.model,
        content=choice.message.content,
        tool_calls=choice.message.tool_calls or [],
        finish_reason=choice.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        seconds=round(seconds, 3),
        tokens_per_second=round(usage.completion_tokens / seconds, 2) if seconds > 0 else 0.0,
    )
