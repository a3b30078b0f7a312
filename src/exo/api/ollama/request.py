"""Ollama chat and generate requests → the GenerateCommand every dialect becomes.

Ollama names tool results by tool (`tool_name`), not by call id: each result answers the earliest unanswered call
of that tool in the history, which is the order agents send them in. Ollama has no `tool_choice`; exo's extension
accepts chat completions' values and enforces them. What cannot be honoured (images, raw prompts, a context window
beyond the model's, samplers exo lacks) is a 400 naming the field, never silently dropped.
"""

import json
from collections.abc import Sequence

from pydantic import JsonValue

from exo.api.adapters.chat_request import openai_tool_policy
from exo.api.adapters.field_policy import log_ignored, unsupported
from exo.api.adapters.json_output import json_output
from exo.api.adapters.tool_controls import check_enforced_schemas
from exo.api.errors import ApiError
from exo.api.types.ollama import (
    OllamaChatRequest,
    OllamaFormat,
    OllamaGenerateRequest,
    OllamaMessage,
    OllamaOptions,
    OllamaTool,
    Think,
)
from exo.api.types.openai_chat import ToolChoice
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId, new_command_id
from exo.shared.types.tasks import (
    GenerationParams,
    PromptMessage,
    PromptToolCall,
    SamplingParams,
    StructuredOutput,
    ToolPolicy,
)

# Ollama's engine settings (threads, GPU layers, memory mapping…): they change how Ollama runs a model, not what
# it answers, and exo's runner decides them itself.
ENGINE_OPTIONS = (
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "num_keep",
    "repeat_last_n",
    "penalize_newline",
)


def _sampler_off(options: OllamaOptions) -> None:
    """400 for a sampler exo does not have, unless the value switches it off (Open WebUI sends the defaults)."""
    for field, off in (("mirostat", 0), ("tfs_z", 1.0), ("typical_p", 1.0)):
        value = getattr(options, field)
        if value is not None and value != off:
            raise unsupported(f"options.{field}", f"the {field} sampler", f"only {off}, which switches it off")


def sampling_params(options: OllamaOptions | None, context_length: int | None) -> SamplingParams:
    """Ollama's `options` as exo's sampling settings. `num_ctx` cannot grow the model's context: a larger value is
    refused, a smaller one changes nothing (exo always uses the model's whole window, documented in docs/AGENTS.md)."""
    if options is None:
        return SamplingParams()
    _sampler_off(options)
    log_ignored(options, ENGINE_OPTIONS)
    if options.num_ctx is not None and context_length is not None and options.num_ctx > context_length:
        raise ApiError(
            400,
            f"options.num_ctx {options.num_ctx} is above this model's context length of {context_length}",
            param="options.num_ctx",
        )
    if options.num_predict == 0:
        raise ApiError(400, "options.num_predict must be positive, -1 or -2", param="options.num_predict")
    max_tokens = options.num_predict if options.num_predict is not None and options.num_predict > 0 else None
    return SamplingParams(
        temperature=options.temperature if options.temperature is not None else 0.0,
        top_p=options.top_p if options.top_p is not None else 1.0,
        top_k=options.top_k or 0,
        min_p=options.min_p or 0.0,
        repetition_penalty=options.repeat_penalty,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
        seed=options.seed,
        max_tokens=max_tokens,
        stop=tuple(options.stop or ()),
    )


def structured_output(format_: OllamaFormat | None) -> StructuredOutput | None:
    """`format`: "json" → any JSON object; a schema → that schema, enforced by the grammar; "" → free text."""
    if format_ is None or format_ == "":
        return None
    if format_ == "json":
        return StructuredOutput(json_schema={"type": "object"})
    if isinstance(format_, str):
        raise ApiError(400, "format must be 'json' or a JSON Schema object", param="format")
    return json_output(format_, strict=False, where="format")


def _template_kwargs(think: Think | None) -> dict[str, JsonValue]:
    # Qwen3-style templates read `enable_thinking`; a level ("high") means thinking on.
    return {} if think is None else {"enable_thinking": think is not False}


def tool_policy(tools: Sequence[OllamaTool] | None, choice: ToolChoice | None) -> ToolPolicy:
    """The policy for Ollama's `tools` (OpenAI's function shape) and exo's optional `tool_choice`."""
    policy = openai_tool_policy(tools or (), choice, parallel=True)
    check_enforced_schemas(policy, field_prefix="function.")
    return policy


def _arguments(arguments: dict[str, object] | str) -> dict[str, object] | str:
    """Arguments as the template wants them: an object, or the text as sent when it is not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        decoded: object = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    return decoded if isinstance(decoded, dict) else arguments  # pyright: ignore[reportUnknownVariableType]


def normalise_messages(messages: Sequence[OllamaMessage]) -> tuple[PromptMessage, ...]:
    """Ollama's history as exo's prompt messages; calls without ids get ones, results are matched to calls."""
    if not messages:
        raise ApiError(400, "messages must contain at least one message", param="messages")
    unanswered: list[PromptToolCall] = []
    result: list[PromptMessage] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if message.images:
            raise unsupported(f"{where}.images", "image input", "the served models read text only")
        calls = tuple(
            PromptToolCall(
                call_id=call.id or f"call_{position}_{index}",
                name=call.function.name,
                arguments=_arguments(call.function.arguments),
            )
            for index, call in enumerate(message.tool_calls or ())
        )
        unanswered.extend(calls)
        call_id = None
        if message.role == "tool":
            answered = _answered_call(unanswered, message, where)
            unanswered.remove(answered)
            call_id = answered.call_id
        result.append(
            PromptMessage(
                role=message.role,
                content=message.content or "",
                reasoning_content=message.thinking,
                tool_calls=calls,
                tool_call_id=call_id,
                name=message.tool_name,
            )
        )
    return tuple(result)


def _answered_call(unanswered: list[PromptToolCall], message: OllamaMessage, where: str) -> PromptToolCall:
    """The call a tool result answers: the one with its `tool_call_id`, else the earliest unanswered call of its
    `tool_name`, else (no name) the earliest unanswered call."""
    for call in unanswered:
        if message.tool_call_id is not None:
            if call.call_id == message.tool_call_id:
                return call
        elif message.tool_name is None or call.name == message.tool_name:
            return call
    named = f" of tool '{message.tool_name}'" if message.tool_name else ""
    raise ApiError(400, f"{where}: a tool result{named} that answers no earlier tool call", param=where)


def _refuse_unsupported(request: OllamaChatRequest | OllamaGenerateRequest) -> None:
    if request.logprobs:
        raise unsupported("logprobs", "logprobs")


def chat_command(request: OllamaChatRequest, model_id: ModelId, context_length: int | None) -> GenerateCommand:
    """Validate /api/chat's `request` (400 ApiError for what cannot be honoured) as a command for `model_id`."""
    _refuse_unsupported(request)
    params = GenerationParams(
        messages=normalise_messages(request.messages),
        tool_policy=tool_policy(request.tools, request.tool_choice).model_copy(
            update={"loop_guard": request.loop_guard}
        ),
        sampling=sampling_params(request.options, context_length),
        chat_template_kwargs=_template_kwargs(request.think),
        structured_output=structured_output(request.format),
    )
    return GenerateCommand(command_id=new_command_id(), model_id=model_id, params=params)


def generate_command(request: OllamaGenerateRequest, model_id: ModelId, context_length: int | None) -> GenerateCommand:
    """/api/generate's prompt (and system prompt) as a one-turn chat, rendered with the model's own template."""
    _refuse_unsupported(request)
    if request.raw:
        raise unsupported("raw", "raw prompts", "the prompt is always rendered with the model's chat template")
    for field in ("suffix", "template", "images", "context"):
        if getattr(request, field):
            raise unsupported(field, f"'{field}' in /api/generate")
    system = [PromptMessage(role="system", content=request.system)] if request.system else []
    params = GenerationParams(
        messages=(*system, PromptMessage(role="user", content=request.prompt)),
        sampling=sampling_params(request.options, context_length),
        chat_template_kwargs=_template_kwargs(request.think),
        structured_output=structured_output(request.format),
    )
    return GenerateCommand(command_id=new_command_id(), model_id=model_id, params=params)
