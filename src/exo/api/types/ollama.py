"""Ollama's wire types: the bodies its clients send to /api/chat and /api/generate, and what they read back.

Ollama's own server ignores unknown fields, so requests here stay open (`extra="allow"`); the fields declared are
strict like every other dialect's (`"0.5"` is not a temperature). Answers follow what Ollama writes, which the
`ollama` Python and JS clients, Open WebUI, Continue and VS Code Copilot parse.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from exo.api.types.openai_chat import FunctionDefinition, ToolChoice
from exo.api.types.wire import MAX_STOP_SEQUENCES, Integer, Seed, StopSequence, WireModel
from exo.shared.types.api import JsonObject

# `format`: "json" for any JSON object, a JSON Schema the reply must match, or "" / absent for free text.
OllamaFormat = Literal["", "json"] | JsonObject
# `keep_alive`: a duration ("5m", 300) or -1; exo keeps its models loaded, so it only has to parse.
KeepAlive = str | float | int
# `think`: a boolean, or a level some models know (gpt-oss); exo passes "on" to the template either way.
Think = bool | Literal["low", "medium", "high"]


class OllamaOptions(WireModel):
    """The `options` Ollama's clients send: sampling knobs, and runtime settings of Ollama's own engine."""

    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Integer | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: Seed | None = None
    # -1: until the model stops, -2: until the context is full (exo stops at the context's end either way).
    num_predict: Integer | None = Field(default=None, ge=-2)
    stop: Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    num_ctx: Integer | None = Field(default=None, ge=1)
    # Samplers exo does not have: refused unless set to the value that switches them off.
    mirostat: Integer | None = None
    tfs_z: float | None = None
    typical_p: float | None = None


class OllamaToolCallFunction(WireModel):
    name: str
    # Ollama sends arguments as an object; a string (an OpenAI habit) is accepted too.
    arguments: JsonObject | str = Field(default_factory=dict)
    index: Integer | None = None


class OllamaToolCall(WireModel):
    id: str | None = None
    function: OllamaToolCallFunction


class OllamaMessage(WireModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    # A tool result names its tool (Ollama's way); newer clients may also send the call's id.
    tool_name: str | None = None
    tool_call_id: str | None = None


class OllamaTool(WireModel):
    type: str = "function"
    function: FunctionDefinition


class OllamaChatRequest(WireModel):
    """The body of POST /api/chat. `stream` defaults to true, as in Ollama."""

    model: str = ""
    messages: list[OllamaMessage] = Field(default_factory=list[OllamaMessage])
    tools: list[OllamaTool] | None = None
    # exo's extension (Ollama has no tool_choice): the same values as chat completions, enforced by the grammar.
    tool_choice: ToolChoice | None = None
    # exo's extension: the agent-loop guard for this request, as chat completions' `loop_guard` (None: the node's).
    loop_guard: Literal["off", "warn", "block", "answer"] | None = None
    stream: bool = True
    format: OllamaFormat | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    logprobs: bool | None = None


class OllamaGenerateRequest(WireModel):
    """The body of POST /api/generate: one prompt (and system prompt) rendered with the model's chat template."""

    model: str = ""
    prompt: str = ""
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[Integer] | None = None
    raw: bool | None = None
    images: list[str] | None = None
    stream: bool = True
    format: OllamaFormat | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    logprobs: bool | None = None


class OllamaShowRequest(WireModel):
    model: str = ""
    # Older clients send `name`.
    name: str | None = None
    verbose: bool | None = None


# ---- answers --------------------------------------------------------------------------------------------------


class OllamaError(BaseModel):
    """Every failure, in Ollama's shape: `{"error": "message"}` with the HTTP status."""

    error: str


class OllamaCallFunction(BaseModel):
    index: int
    name: str
    arguments: JsonObject


class OllamaCall(BaseModel):
    id: str
    function: OllamaCallFunction


class OllamaAnswerMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None
    tool_calls: list[OllamaCall] | None = None


class OllamaTimings(BaseModel):
    """What the final object of an answer adds: why it ended, token counts and durations in nanoseconds."""

    done_reason: Literal["stop", "length"]
    total_duration: int
    # exo's own: what the agent-loop guard found (docs/TOOL_CALLING.md); absent when it found nothing.
    exo_loop_warnings: list[str] | None = None
    load_duration: int = 0
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int


class OllamaChatAnswer(BaseModel):
    """One line of a streamed /api/chat answer (or the whole answer when `stream` is false)."""

    model: str
    created_at: str
    message: OllamaAnswerMessage
    done: bool


class OllamaGenerateAnswer(BaseModel):
    """One line of a streamed /api/generate answer (or the whole answer when `stream` is false)."""

    model: str
    created_at: str
    response: str
    thinking: str | None = None
    done: bool


class OllamaLoaded(OllamaGenerateAnswer):
    """/api/generate's answer to an empty prompt, which in Ollama only loads the model."""

    response: str = ""
    done: bool = True
    done_reason: Literal["load"] = "load"


class OllamaChatFinal(OllamaChatAnswer, OllamaTimings):
    """The last line of /api/chat: the answer's end (the whole message when not streamed) and its counts."""


class OllamaGenerateFinal(OllamaGenerateAnswer, OllamaTimings):
    """The last line of /api/generate."""


class OllamaModelDetails(BaseModel):
    parent_model: str = ""
    format: str
    family: str
    families: list[str]
    parameter_size: str = ""
    quantization_level: str


class OllamaModelEntry(BaseModel):
    """A model of /api/tags (served in the cluster) and /api/ps (loaded on a node)."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: OllamaModelDetails
    expires_at: str | None = None
    size_vram: int | None = None
    context_length: int | None = None


class OllamaModelList(BaseModel):
    models: list[OllamaModelEntry]


class OllamaShowAnswer(BaseModel):
    modified_at: str
    template: str = ""
    parameters: str = ""
    license: str = ""
    details: OllamaModelDetails
    model_info: dict[str, str | int]
    capabilities: list[str]


class OllamaVersion(BaseModel):
    version: str
