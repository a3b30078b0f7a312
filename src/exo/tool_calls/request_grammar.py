"""Assemble a whole grammar: an optional reasoning block, then the reply the format writes for the request.

It looks the format up in the registry, so it sits beside it, above `formats/`, which build on `grammar/`."""

import json
from collections.abc import Callable, Iterable, Mapping

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.lark import LarkWriter, json_options, raise_if_rejected
from exo.tool_calls.grammar.reply import FormatGrammar, ReplyRequest
from exo.tool_calls.grammar.spec import (
    ANY_ARGUMENTS,
    JsonAnswerSpec,
    ReasoningMarkers,
    ReplyShape,
    ToolConstraintSpec,
    UnsupportedConstraintError,
)
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.registry import format_for

SpecialTokens = Callable[[Iterable[str]], Mapping[str, int]]
"""Given marker texts, those the model's tokenizer has as one added token, with their ids."""


def grammar_for(spec: ToolConstraintSpec | JsonAnswerSpec, special_tokens: SpecialTokens) -> str:
    """The llguidance lark grammar that enforces `spec`, its markers matched as the tokenizer has them (see
    `build_tool_grammar`); raises UnsupportedConstraintError."""
    if isinstance(spec, JsonAnswerSpec):
        return build_answer_grammar(spec, special_tokens=special_tokens(answer_marker_texts(spec)))
    return build_tool_grammar(spec, special_tokens=special_tokens(tool_marker_texts(spec)))


def format_grammar(tool_format: ToolFormatName) -> FormatGrammar:
    return format_for(tool_format).grammar


def tool_marker_texts(spec: ToolConstraintSpec) -> tuple[str, ...]:
    """Texts the grammar for `spec` writes as markers: the caller looks up which are single added tokens."""
    return (*format_grammar(spec.tool_format).marker_texts, *_reasoning_texts(spec.reasoning))


def answer_marker_texts(spec: JsonAnswerSpec) -> tuple[str, ...]:
    """As `tool_marker_texts`, for a structured-output grammar."""
    calls = format_grammar(spec.tool_format).marker_texts if spec.tools else ()
    return (*calls, *_reasoning_texts(spec.reasoning))


def build_tool_grammar(spec: ToolConstraintSpec, *, special_tokens: Mapping[str, int] | None = None) -> str:
    """The llguidance lark grammar that enforces `spec`.

    `special_tokens` maps a marker text (such as `<tool_call>`) to its token id when the tokenizer has it as one
    added token, so the grammar accepts both the token and the marker spelled out in ordinary pieces. Raises
    UnsupportedConstraintError for schemas llguidance cannot compile (such as a `$ref` to nowhere) and for
    keywords a format cannot express under `strict`. Under "auto" only a strict tool can fail so: another tool
    whose schema the grammar cannot hold takes any arguments object (its calls are validated afterwards).
    """
    if not spec.tools and spec.shape is not ReplyShape.TEXT_ONLY:
        raise UnsupportedConstraintError("a tool-call constraint needs at least one tool")
    try:
        return _tool_grammar(spec, special_tokens or {})
    except UnsupportedConstraintError:
        if spec.shape is not ReplyShape.TEXT_OR_CALLS:
            raise
    # Under "auto" a non-strict tool whose schema cannot be enforced is only validated, never a refusal.
    tools = tuple(tool if tool.strict or _enforceable(spec, tool) else _loose(tool) for tool in spec.tools)
    return _tool_grammar(spec.model_copy(update={"tools": tools}), special_tokens or {})


def _tool_grammar(spec: ToolConstraintSpec, special_tokens: Mapping[str, int]) -> str:
    lark = LarkWriter(special_tokens)
    request = ReplyRequest(shape=spec.shape, tools=spec.tools, parallel=spec.parallel_tool_calls)
    reply = lark.rule("reply", format_grammar(spec.tool_format).reply(lark, request))
    grammar = lark.grammar(_start(lark, spec.reasoning, reply))
    raise_if_rejected(grammar)
    return grammar


def _enforceable(spec: ToolConstraintSpec, tool: ToolSpec) -> bool:
    """Whether the grammar can hold `tool`'s calls to its schema on its own."""
    try:
        _tool_grammar(spec.model_copy(update={"tools": (tool,), "reasoning": None}), {})
    except UnsupportedConstraintError:
        return False
    return True


def build_answer_grammar(spec: JsonAnswerSpec, *, special_tokens: Mapping[str, int] | None = None) -> str:
    """The grammar for `response_format`: optional reasoning, then the JSON answer or (with tools) calls.

    The answer is one value valid against the schema, and then only end-of-turn is allowed. Under
    `tool_choice: "auto"` with tools the model may open calls in its own format instead (non-strict tools keep
    their names but take any arguments object). Raises UnsupportedConstraintError as `build_tool_grammar` does.
    """
    lark = LarkWriter(special_tokens or {})
    options = json_options(every_keyword_enforced=spec.every_keyword_enforced)
    lark.rule("answer", f"%json {json.dumps({**spec.json_schema, 'x-guidance': options})}")
    if spec.tools:
        tools = spec.tools if spec.tool_schemas_enforced else _any_arguments(spec.tools)
        request = ReplyRequest(shape=ReplyShape.ANSWER_OR_CALLS, tools=tools, parallel=spec.parallel_tool_calls)
        reply = lark.rule("reply", format_grammar(spec.tool_format).reply(lark, request))
    else:
        reply = "answer"
    grammar = lark.grammar(_start(lark, spec.reasoning, reply))
    raise_if_rejected(grammar, "the response_format schema")
    return grammar


def _start(lark: LarkWriter, reasoning: ReasoningMarkers | None, reply: str) -> str:
    """The reply, after a reasoning block when the model has one (its text free, ended by its marker)."""
    if reasoning is None:
        return reply
    rest = lark.rule("reasoning_rest", f"{lark.text_until(reasoning.end, 'reasoning')} /\\n{{0,2}}/")
    if reasoning.opened_in_prompt:
        return f"{rest} {reply}"
    return f"({lark.marker(reasoning.start)} {rest})? {reply}"


def _reasoning_texts(reasoning: ReasoningMarkers | None) -> tuple[str, ...]:
    return (reasoning.start, reasoning.end) if reasoning else ()


def _any_arguments(tools: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
    """Non-strict tools keep their names but not their schemas: arguments are any object, as without a grammar."""
    return tuple(_loose(tool) for tool in tools)


def _loose(tool: ToolSpec) -> ToolSpec:
    return tool.model_copy(update={"parameters": ANY_ARGUMENTS})
