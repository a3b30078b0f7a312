"""What a runner streams back for one task, in order. Each chunk maps onto one OpenAI delta (or the end)."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.types.common import FinishReason, FrozenModel, ToolCallId


class Usage(FrozenModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    # Of the cached tokens, those read from the prefix cache's disk tier (the rest were in memory).
    disk_cached_tokens: int = 0
    reasoning_tokens: int = 0
    repeated_tool_calls: int = 0
    """Calls of the reply identical to a call whose result the conversation already held (the loop guard's count),
    those it withdrew included."""
    withdrawn_tool_calls: int = 0
    """Of those, the calls the loop guard's `answer` took back (the reply was decoded again without calls)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenChunk(FrozenModel):
    """Plain assistant content."""

    kind: Literal["token"] = "token"
    text: str


class ReasoningChunk(FrozenModel):
    """Text inside the model's reasoning block (`<think>…</think>`): sent as `delta.reasoning_content`."""

    kind: Literal["reasoning"] = "reasoning"
    text: str


class ToolCallChunk(FrozenModel):
    """The start of tool call `index`: its id and name, known before any argument text."""

    kind: Literal["tool_call"] = "tool_call"
    index: int
    call_id: ToolCallId
    name: str


class ToolCallArgumentsChunk(FrozenModel):
    """A fragment of the JSON arguments of tool call `index`; fragments concatenate to the full arguments."""

    kind: Literal["tool_call_arguments"] = "tool_call_arguments"
    index: int
    fragment: str


class FinishChunk(FrozenModel):
    """The last chunk of a successful task."""

    kind: Literal["finish"] = "finish"
    finish_reason: FinishReason
    usage: Usage
    # The client's stop sequence that ended generation, if one did (the Messages API reports which).
    stop_sequence: str | None = None
    # What the agent-loop guard found in the reply (repeated calls, ping-pong); empty when it found nothing or is off.
    loop_warnings: tuple[str, ...] = ()


TaskErrorKind = Literal[
    "context_length_exceeded",  # the prompt leaves no room to generate in the model's context
    "unsupported",  # the request asks for enforcement the grammar cannot give (a schema it cannot compile or finish)
    "invalid_request",  # the engine refused a value of the request; `param` names it
    "model_unavailable",  # the model cannot serve: it failed to load, or the node is shutting down
    "runner_stopped",  # the runner died before the task started: nothing ran, retrying is safe
    "runner_crashed",  # the runner died while running the task
    "node_left",  # the node running the task left the cluster (crashed, froze or lost its network)
    "dispatch_failed",  # the task could not be handed to the runner
    "generation_failed",  # the engine raised while generating
]


class ErrorChunk(FrozenModel):
    """The task failed; nothing follows. It says what went wrong; the front end decides what that is on its wire."""

    kind: Literal["error"] = "error"
    error: TaskErrorKind
    message: str
    # The request field at fault, when one is (in the request's own naming: `top_k`, `messages[0].content`).
    param: str | None = None


class PrefillProgressChunk(FrozenModel):
    """How far the runner has read the prompt: never content, it feeds /state, keep-alives and the request log.

    Sent when prefill starts (done = cached) and when it ends (done = the whole prompt), and between its pieces.
    """

    kind: Literal["prefill_progress"] = "prefill_progress"
    prompt_tokens: int  # the whole prompt
    done_tokens: int  # computed or taken from cache so far
    cached_tokens: int  # of which reused from the prefix cache (memory+disk)
    disk_cached_tokens: int = 0  # of those, loaded from the disk tier


Chunk = Annotated[
    TokenChunk
    | ReasoningChunk
    | ToolCallChunk
    | ToolCallArgumentsChunk
    | FinishChunk
    | ErrorChunk
    | PrefillProgressChunk,
    Field(discriminator="kind"),
]

# What the tool parser emits while it watches generation (the runner adds Finish/Error itself).
ParsedChunk = TokenChunk | ReasoningChunk | ToolCallChunk | ToolCallArgumentsChunk
