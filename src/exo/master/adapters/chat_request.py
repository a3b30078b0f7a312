"""OpenAI chat request → ChatCompletionCommand, rejecting what cannot be honoured with a clear 400."""

import logging
from collections.abc import Sequence

from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import JsonValue

from exo.master.adapters.schema_termination import (
    CheckBudget,
    as_tool_parameters,
    self_application_cycle,
    unfinishable_reason,
)
from exo.master.errors import ApiError
from exo.shared.types.api import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionDefinition,
    JsonObjectResponseFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    TextContentPart,
    TextResponseFormat,
    ToolCall,
)
from exo.shared.types.commands import ChatCompletionCommand
from exo.shared.types.common import ModelId, new_command_id
from exo.shared.types.tasks import (
    ChatCompletionTaskParams,
    PromptMessage,
    PromptToolCall,
    SamplingParams,
    StructuredOutput,
    ToolPolicy,
)
from exo.shared.types.worker.runner_response import ModelMetadata

logger = logging.getLogger(__name__)

# Request fields accepted for compatibility but not acted on: clients such as opencode, the AI SDK or scripts
# written for vLLM send them routinely, and rejecting them would break those clients for no benefit. Each one has no
# effect on a single local completion (user, store, metadata…); docs/OPERATIONS.md lists them.
IGNORED_REQUEST_FIELDS = (
    "reasoning_effort",
    "verbosity",
    "top_logprobs",
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
)


def _content_text(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for position, part in enumerate(content):
        if not isinstance(part, TextContentPart):
            if part.type == "text":
                raise ApiError(400, f"{where}.content[{position}]: a text part needs a 'text' string")
            raise ApiError(
                400,
                f"{where}.content[{position}]: content parts of type '{part.type}' are not supported (only 'text')",
                param=f"{where}.content",
                code="unsupported_content_type",
            )
        texts.append(part.text)
    return "".join(texts)


def _tool_call(call: ToolCall) -> PromptToolCall:
    # Arguments that are not JSON (a call the model cut off at max_tokens, sent back by the agent) are kept as
    # text: OpenAI accepts them, and the template renders the string as the model wrote it.
    return PromptToolCall(call_id=call.id or "", name=call.function.name, arguments=call.function.arguments)


def normalise_messages(messages: Sequence[ChatMessage]) -> tuple[PromptMessage, ...]:
    """Validate history and normalise it for templates (content parts joined, `developer` → `system`)."""
    if not messages:
        raise ApiError(400, "messages must contain at least one message", param="messages")
    known_call_ids: set[str] = set()
    result: list[PromptMessage] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        calls = tuple(_tool_call(call) for call in message.tool_calls or [])
        known_call_ids.update(call.call_id for call in calls if call.call_id)
        if message.role == "tool":
            if not message.tool_call_id:
                raise ApiError(400, f"{where}: a message with role 'tool' needs a tool_call_id", param=where)
            if message.tool_call_id not in known_call_ids:
                raise ApiError(
                    400,
                    f"{where}: tool_call_id '{message.tool_call_id}' does not match any earlier assistant tool call",
                    param=f"{where}.tool_call_id",
                )
        result.append(
            PromptMessage(
                role="system" if message.role == "developer" else message.role,
                content=_content_text(message.content, where),
                reasoning_content=message.reasoning_content,
                tool_calls=calls,
                tool_call_id=message.tool_call_id,
                name=message.name,
            )
        )
    return tuple(result)


def _check_tools(request: ChatCompletionRequest) -> tuple[FunctionDefinition, ...]:
    tools = request.tools or []
    seen: set[str] = set()
    for position, tool in enumerate(tools):
        where = f"tools[{position}]"
        if tool.type != "function":
            raise ApiError(400, f"{where}.type must be 'function', got '{tool.type}'", param=f"{where}.type")
        name = tool.function.name
        if not name or len(name) > 64 or not all(char.isalnum() or char in "_-." for char in name):
            raise ApiError(400, f"{where}.function.name '{name}' must be 1-64 letters, digits, '_', '-' or '.'")
        if name in seen:
            raise ApiError(400, f"{where}: duplicate tool name '{name}'", param=f"{where}.function.name")
        seen.add(name)
        try:
            validator_for(tool.function.parameters).check_schema(tool.function.parameters)
        except SchemaError as error:
            raise ApiError(
                400,
                f"{where}.function.parameters is not a valid JSON Schema: {error.message}",
                param=f"{where}.function.parameters",
            ) from error
    return tuple(tool.function for tool in tools)


def _grammar_enforced(policy: ToolPolicy) -> set[str]:
    """The names of the tools whose schemas the grammar enforces: the callable ones when calls are forced or any
    callable tool is strict; none under plain "auto" (the parser checks arguments after the fact there)."""
    callable_names = set(policy.callable_tools) or {tool.name for tool in policy.tools}
    if policy.mode in ("required", "named"):
        return callable_names
    strict = any(tool.strict for tool in policy.tools if tool.name in callable_names)
    return callable_names if policy.mode == "auto" and strict else set()


def check_schemas_finish(policy: ToolPolicy, output: StructuredOutput | None) -> None:
    """400 `unsupported` for a schema nothing can finish (see schema_termination.py): one that applies itself to
    the same value without end, anywhere; one no finite value satisfies, where the grammar enforces it."""
    budget = CheckBudget()
    enforced = _grammar_enforced(policy)
    schemas = [
        (f"tools[{position}].function.parameters", as_tool_parameters(tool.parameters), tool.name in enforced)
        for position, tool in enumerate(policy.tools)
    ]
    if output is not None:
        schemas.append(("response_format.json_schema.schema", output.json_schema, True))
    for where, schema, finished_by_grammar in schemas:
        problem = self_application_cycle(schema, budget)
        if problem is None and finished_by_grammar:
            problem = unfinishable_reason(schema, budget)
        if problem is not None:
            raise ApiError(400, f"{where} cannot be served: {problem}", param=where, code="unsupported")


def tool_policy(request: ChatCompletionRequest) -> ToolPolicy:
    """Decide what the model may do with tools from `tools`, `tool_choice` and `parallel_tool_calls`."""
    tools = _check_tools(request)
    names = {tool.name for tool in tools}
    parallel = request.parallel_tool_calls is not False
    choice = request.tool_choice
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice requires a non-empty tools list", param="tool_choice")
        return ToolPolicy(mode="none")
    match choice:
        case None | "auto":
            return ToolPolicy(tools=tools, mode="auto", parallel_tool_calls=parallel)
        case "none":
            return ToolPolicy(tools=tools, mode="none", parallel_tool_calls=parallel)
        case "required":
            return ToolPolicy(tools=tools, mode="required", parallel_tool_calls=parallel)
        case NamedToolChoice(function=function):
            if function.name not in names:
                raise ApiError(400, f"tool_choice names '{function.name}', which is not in tools", param="tool_choice")
            return ToolPolicy(tools=tools, callable_tools=(function.name,), mode="named", parallel_tool_calls=False)
        case AllowedToolsChoice(allowed_tools=allowed):
            allowed_names = _allowed_tool_names(allowed.tools, names)
            return ToolPolicy(
                tools=tools, callable_tools=allowed_names, mode=allowed.mode, parallel_tool_calls=parallel
            )


def _allowed_tool_names(entries: Sequence[dict[str, object]], names: set[str]) -> tuple[str, ...]:
    result: list[str] = []
    for position, entry in enumerate(entries):
        function = entry.get("function")
        name = function.get("name") if isinstance(function, dict) else entry.get("name")
        if not isinstance(name, str) or name not in names:
            raise ApiError(
                400,
                f"tool_choice.allowed_tools.tools[{position}] must name a tool from tools",
                param="tool_choice.allowed_tools",
            )
        result.append(name)
    if not result:
        raise ApiError(400, "tool_choice.allowed_tools.tools must not be empty", param="tool_choice.allowed_tools")
    return tuple(result)


def sampling_params(request: ChatCompletionRequest, vocabulary_size: int | None) -> SamplingParams:
    """The sampling settings; ranges that do not depend on the model were checked with the request's schema,
    `top_k` is checked here against the model's `vocabulary_size` (when the runner reported it)."""
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    if request.n is not None and request.n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    if vocabulary_size is not None and request.top_k is not None and request.top_k >= vocabulary_size:
        raise ApiError(
            400,
            f"top_k must be below the model's vocabulary size of {vocabulary_size} (0 or -1: no limit), "
            f"got {request.top_k}",
            param="top_k",
        )
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingParams(
        temperature=request.temperature if request.temperature is not None else 0.0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        top_k=max(request.top_k or 0, 0),
        min_p=request.min_p or 0.0,
        repetition_penalty=request.repetition_penalty,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        seed=request.seed,
        max_tokens=max_tokens,
        stop=tuple(stop),
    )


# Template variables exo sets itself: a client overriding them would break the prompt (and tool) rendering.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message", "tokenize"}
)


def chat_template_kwargs(request: ChatCompletionRequest) -> dict[str, JsonValue]:
    """The client's extra chat-template variables (e.g. `enable_thinking`), minus the ones exo must control."""
    kwargs = dict(request.chat_template_kwargs or {})
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ApiError(
            400,
            f"chat_template_kwargs may not set {', '.join(reserved)}: exo renders those from the request itself",
            param="chat_template_kwargs",
        )
    return kwargs


def structured_output(request: ChatCompletionRequest) -> StructuredOutput | None:
    """The JSON the reply's content must be (`response_format` json_object / json_schema), schema checked here.

    A schema that is not valid JSON Schema is a 400 naming the problem; what is valid but beyond llguidance (such
    as a `$ref` to nowhere) is refused by the runner when it compiles the grammar, also as a 400.
    """
    match request.response_format:
        case None | TextResponseFormat():
            return None
        case JsonObjectResponseFormat():
            return StructuredOutput(json_schema={"type": "object"})
        case JsonSchemaResponseFormat(json_schema=spec):
            try:
                validator_for(spec.schema_).check_schema(spec.schema_)
            except SchemaError as error:
                raise ApiError(
                    400,
                    f"response_format.json_schema.schema is not a valid JSON Schema: {error.message}",
                    param="response_format.json_schema.schema",
                ) from error
            return StructuredOutput(json_schema=spec.schema_, strict=spec.strict is True)


def reject_unsupported_features(request: ChatCompletionRequest) -> None:
    """400 for fields that would change the answer in ways we cannot honour (rather than silently ignoring them)."""
    if request.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")
    if request.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias", code="unsupported_parameter")


def to_command(
    request: ChatCompletionRequest, model_id: ModelId, metadata: ModelMetadata | None = None
) -> ChatCompletionCommand:
    """Validate `request` (400 ApiError for anything we cannot honour) and turn it into a command for `model_id`,
    whose runner reported `metadata` (None while it loads: the checks that need it are then left to the runner)."""
    reject_unsupported_features(request)
    ignored = [name for name in IGNORED_REQUEST_FIELDS if name in request.model_fields_set]
    if ignored:
        logger.debug("ignoring request fields %s", ", ".join(ignored))
    policy = tool_policy(request)
    output = structured_output(request)
    check_schemas_finish(policy, output)
    params = ChatCompletionTaskParams(
        messages=normalise_messages(request.messages),
        tool_policy=policy,
        sampling=sampling_params(request, metadata.vocab_size if metadata else None),
        chat_template_kwargs=chat_template_kwargs(request),
        structured_output=output,
    )
    return ChatCompletionCommand(command_id=new_command_id(), model_id=model_id, params=params)
