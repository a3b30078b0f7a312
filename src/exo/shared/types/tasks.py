"""A task is one unit of work a runner performs: here, one chat completion."""

from typing import Final, Literal

from pydantic import Field, JsonValue

from exo.shared.types.common import CommandId, FrozenModel, ModelId, TaskId
from exo.shared.types.tool_spec import ToolSpec

Role = Literal["system", "user", "assistant", "tool"]
# How the model may use the offered tools; every wire protocol's tool-choice names map onto these.
ToolChoiceMode = Literal["none", "auto", "required", "named"]
# The agent-loop guard (exo.tool_calls.loop_guard): off; warn (report repeated calls); block and answer (a real loop,
# the third identical call in a row after identical results or the fifth after the same error four times, is taken
# back and the reply decoded again without that tool, or without calls, so the model answers in text).
LoopGuardPolicy = Literal["off", "warn", "block", "answer"]
# The request header that names a LoopGuardPolicy for one request (exo.api.loop_guard_header); `exo launch
# --loop-guard` has clients send it.
LOOP_GUARD_HEADER: Final = "X-Exo-Loop-Guard"
# Where a request's tool definitions go in the prompt (exo.worker.engines.mlx.prompt_layout): where the chat template
# puts them, or before the system text where the template allows it exactly.
PromptLayout = Literal["template", "tools-first"]


class PromptToolCall(FrozenModel):
    """A call from the conversation history, arguments already decoded to an object where they were JSON."""

    call_id: str
    name: str
    arguments: dict[str, object] | str


class PromptMessage(FrozenModel):
    """One history message, normalised by the API (content parts joined, `developer` → `system`)."""

    role: Role
    content: str
    reasoning_content: str | None = None
    tool_calls: tuple[PromptToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


class ToolPolicy(FrozenModel):
    """What the model may do with tools in this completion (decided by the API from the request)."""

    tools: tuple[ToolSpec, ...] = ()
    # The subset that may actually be called (allowed_tools / a named choice); empty means all of `tools`.
    callable_tools: tuple[str, ...] = ()
    mode: ToolChoiceMode = "auto"
    parallel_tool_calls: bool = True
    # Whether "auto" holds an opened call to the tools' schemas with a grammar; None: the node's setting decides.
    auto_grammar: bool | None = None
    # Non-strict tools whose schemas no finite value satisfies: under "auto" their calls are validated, never held
    # to the schema (a grammar could not let such a call end).
    unenforceable_tools: tuple[str, ...] = ()
    # The agent-loop guard for this request; None: the node's setting decides.
    loop_guard: LoopGuardPolicy | None = None
    # Under "auto", re-decode once under the lazy grammar a call that failed to parse or validate where no grammar
    # held it; None: the node's setting decides.
    repair: bool | None = None


class SamplingParams(FrozenModel):
    temperature: float = 0.0
    top_p: float = 1.0
    # 0 keeps every token (vLLM's -1 is mapped to 0 by the API).
    top_k: int = 0
    min_p: float = 0.0
    # None or 0 leaves the logits alone; applied by mlx-lm's processors over the last 20 tokens.
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()


class StructuredOutput(FrozenModel):
    """`response_format` json_object / json_schema: the reply's content must be JSON valid against `json_schema`.

    The API checked the schema; json_object arrives as `{"type": "object"}`.
    """

    json_schema: dict[str, JsonValue]
    # json_schema `strict: true`: a keyword the grammar cannot enforce (such as `uniqueItems`) fails the request
    # instead of going unenforced, so a reply always validates.
    strict: bool = False


class GenerationParams(FrozenModel):
    messages: tuple[PromptMessage, ...]
    tool_policy: ToolPolicy = Field(default_factory=ToolPolicy)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    # Extra variables for the model's chat template (e.g. Qwen3's `enable_thinking`).
    chat_template_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    # None: free text (`response_format` absent or "text").
    structured_output: StructuredOutput | None = None
    # Render the prompt and report its length as usage.prompt_tokens, generating nothing (token counting).
    count_prompt_only: bool = False


class GenerationTask(FrozenModel):
    task_id: TaskId
    command_id: CommandId
    model_id: ModelId
    params: GenerationParams
