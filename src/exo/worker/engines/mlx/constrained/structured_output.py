"""OpenAI structured outputs (`response_format` json_object / json_schema) as a grammar over the reply.

The answer is one `%json` value with the request's schema as its own root, written in the same compact layout
as tool arguments, and then only end-of-turn is allowed: the reply ends as soon as the value is complete. Under
`tool_choice: "auto"` with tools the model may instead open calls in its own format (the tool grammar's call
rules): a reply is either calls or the JSON answer, never prose. A reasoning model thinks freely first.
"""

import json
from collections.abc import Mapping
from typing import Final

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.api import FunctionDefinition, JsonObject
from exo.shared.types.common import FrozenModel
from exo.worker.engines.mlx.constrained.compiled import guidance_tokenizer, new_matcher
from exo.worker.engines.mlx.constrained.grammar import (
    ANY_TEXT,
    LLAMA3_JSON_FORMAT,
    NEWLINE,
    SUPPORTED_FORMATS,
    TAGGED_JSON_FORMATS,
    body_rules,
    format_marker_texts,
    json_options,
    llama3_call,
    raise_if_rejected,
    start_rules,
    tagged_call_rules,
)
from exo.worker.engines.mlx.constrained.logits_processor import ToolCallLogitsProcessor
from exo.worker.engines.mlx.constrained.spec import ReasoningMarkers, UnsupportedConstraintError

_ANY_ARGUMENTS: Final[JsonObject] = {"type": "object"}


class JsonAnswerSpec(FrozenModel):
    """Everything the structured-output grammar depends on; built by the runner from the task."""

    json_schema: JsonObject
    """The answer's schema (json_object: `{"type": "object"}`)."""
    every_keyword_enforced: bool = False
    """True (json_schema `strict: true`): a keyword llguidance cannot enforce is an error, not skipped."""
    reasoning: ReasoningMarkers | None = None
    tool_format: str = ""
    """The model's tool-call format; only read when `tools` is not empty."""
    tools: tuple[FunctionDefinition, ...] = ()
    """Tools the model may call instead of answering (`tool_choice: "auto"`); empty: the answer is the reply."""
    tool_schemas_enforced: bool = False
    """Whether call arguments must match each tool's schema (a `strict` tool was offered) or be any object."""
    parallel_tool_calls: bool = True


def build_answer_grammar(spec: JsonAnswerSpec, *, special_tokens: Mapping[str, int] | None = None) -> str:
    """The llguidance lark grammar for `spec`: optional reasoning, then the JSON answer or (with tools) calls.

    `special_tokens` is as for `build_tool_grammar`. Raises UnsupportedConstraintError when the schema cannot be
    compiled (a `$ref` to nowhere, a look-around `pattern`; with `every_keyword_enforced`, a keyword such as
    `uniqueItems`), naming the problem, and when tools are offered in a format without call rules.
    """
    markers = special_tokens or {}
    answer_options = json_options(every_keyword_enforced=spec.every_keyword_enforced)
    answer = f"answer: %json {json.dumps({**spec.json_schema, 'x-guidance': answer_options})}"
    grammar = "\n".join(
        ["%llguidance {}", *start_rules(spec.reasoning, markers), ANY_TEXT, *_reply_rules(spec, markers), answer]
    )
    raise_if_rejected(grammar, "the response_format schema")
    return grammar


def answer_marker_texts(spec: JsonAnswerSpec) -> tuple[str, ...]:
    """Texts the grammar for `spec` writes as markers: the caller looks up which are single added tokens."""
    return format_marker_texts(spec.tool_format, spec.reasoning, with_calls=bool(spec.tools))


def make_answer_logits_processor(
    tokenizer: TokenizerWrapper, spec: JsonAnswerSpec, *, prompt_length: int
) -> ToolCallLogitsProcessor:
    """A processor enforcing `spec` for one request (`prompt_length` as for `make_tool_logits_processor`).

    The compiled grammar comes from the same cache as the tool grammars, so a repeated schema compiles once.
    """
    guidance = guidance_tokenizer(tokenizer)
    grammar = build_answer_grammar(spec, special_tokens=guidance.special_tokens(answer_marker_texts(spec)))
    matcher = new_matcher(guidance.lltokenizer, grammar)
    return ToolCallLogitsProcessor(matcher, guidance.lltokenizer.vocab_size, prompt_length=prompt_length)


def _reply_rules(spec: JsonAnswerSpec, markers: Mapping[str, int]) -> list[str]:
    """`reply`: the answer, or (when tools may be called) calls in the model's format in its place."""
    if not spec.tools:
        return ["reply: answer"]
    tools = spec.tools if spec.tool_schemas_enforced else _any_arguments(spec.tools)
    if spec.tool_format in TAGGED_JSON_FORMATS:
        more_calls = f" ({NEWLINE} call)*" if spec.parallel_tool_calls else ""
        return [f"reply: answer | call{more_calls}", *tagged_call_rules(tools, markers)]
    if spec.tool_format == LLAMA3_JSON_FORMAT:
        # Both alternatives may open with "{": the parser reads a reply shaped like a call as the call.
        return [f"reply: answer | {llama3_call(markers)}", *body_rules(tools, "parameters")]
    raise UnsupportedConstraintError(
        f"response_format with tools needs call rules for the model's tool format {spec.tool_format!r} "
        f"(supported: {sorted(SUPPORTED_FORMATS)}); send tool_choice 'none' or leave out response_format"
    )


def _any_arguments(tools: tuple[FunctionDefinition, ...]) -> tuple[FunctionDefinition, ...]:
    """Non-strict tools keep their names but not their schemas: arguments are any object, as without a grammar."""
    return tuple(tool.model_copy(update={"parameters": _ANY_ARGUMENTS}) for tool in tools)
