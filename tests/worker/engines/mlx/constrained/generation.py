"""Sampling driver and output checks shared by the constrained-generation tests."""

import json
import re
from collections.abc import Callable, Sequence
from typing import Final

import jsonschema
import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper
from pydantic import BaseModel, JsonValue

from exo.shared.types.tool_spec import ToolSpec
from tests.worker.engines.mlx.constrained.tiny_models import MARKERS

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

PROMPT: Final = "What is the weather in Paris? Use the tools."
_STEERING_BOOST: Final = 3.0
_MARKER_BOOST: Final = 8.0
_END_BOOST: Final = 5.0
_HERMES_CALL: Final = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)


class Generation(BaseModel):
    text: str
    tokens: list[int]
    ended_with_eos: bool


class ParsedCall(BaseModel):
    name: str
    arguments: JsonValue


def generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    processors: Sequence[LogitsProcessor],
    *,
    seed: int,
    max_tokens: int = 400,
) -> Generation:
    """Sample at temperature 1.0 until EOS or `max_tokens` (EOS itself is not part of the text)."""
    prompt = tokenizer.encode(PROMPT)
    mx.random.seed(seed)
    tokens: list[int] = []
    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=max_tokens,
        sampler=make_sampler(temp=1.0),
        logits_processors=list(processors) or None,
    )
    for step_token, _ in steps:
        token = int(step_token)
        if token in tokenizer.eos_token_ids:
            return Generation(text=tokenizer.decode(tokens), tokens=tokens, ended_with_eos=True)
        tokens.append(token)
    return Generation(text=tokenizer.decode(tokens), tokens=tokens, ended_with_eos=False)


def prompt_length(tokenizer: TokenizerWrapper) -> int:
    return len(tokenizer.encode(PROMPT))


def steering_processor(tokenizer: TokenizerWrapper, *, end_boost: float = _END_BOOST) -> LogitsProcessor:
    """Stands in for a model that likes to close strings, objects and turns.

    A random model writes strings hundreds of tokens long; this keeps samples short. It runs *before* the
    constraint, so it can only make forbidden tokens more attractive, never allowed ones legal.
    """
    vocabulary: dict[str, int] = tokenizer.vocab  # pyright: ignore[reportAssignmentType] -- HF vocab mapping
    favoured = {
        token_id
        for token_id in range(len(vocabulary))
        if any(character in tokenizer.decode([token_id]) for character in ('"', "}", "]", ",", "<"))
        and tokenizer.decode([token_id]) not in MARKERS
    }

    def boost(tokens: mx.array, logits: mx.array) -> mx.array:
        del tokens
        bias = mx.zeros((logits.shape[-1],), dtype=logits.dtype)
        bias[mx.array(sorted(favoured))] = _STEERING_BOOST
        bias[mx.array(sorted(tokenizer.eos_token_ids))] = end_boost
        return logits + bias

    return boost


def marker_steering_processor(
    tokenizer: TokenizerWrapper, marker_text: str = "<tool_call>", *, once: bool = False
) -> LogitsProcessor:
    """Stands in for a model that decides to call a tool (or stop thinking): it pushes towards spelling the marker,
    piece by piece.

    Random text almost never spells a marker that is several BPE pieces, so the tests need this to reach the
    constrained part of the grammar (or leave the free reasoning block) at all. With `once`, the push stops after
    the marker is written (otherwise it also fills free-form JSON strings with marker pieces).
    """
    marker: list[int] = tokenizer.encode(marker_text)
    written_once = False

    def boost(tokens: mx.array, logits: mx.array) -> mx.array:
        nonlocal written_once
        tail: list[int] = tokens[-len(marker) :].tolist()  # pyright: ignore[reportAssignmentType] -- 1-D ints
        written_once = written_once or (once and tail == marker)
        if written_once:
            return logits
        written = next((size for size in range(len(marker) - 1, 0, -1) if tail[-size:] == marker[:size]), 0)
        bias = mx.zeros((logits.shape[-1],), dtype=logits.dtype)
        bias[marker[written]] = _MARKER_BOOST
        return logits + bias

    return boost


def parse_hermes_calls(text: str) -> list[ParsedCall]:
    """Calls of a reply that must be nothing but `<tool_call>` blocks joined by newlines; raises otherwise."""
    blocks = _HERMES_CALL.findall(text)
    if "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks) != text or not blocks:
        raise AssertionError(f"not a sequence of hermes calls: {text!r}")
    return [_parse_call(block, "arguments") for block in blocks]


def split_strict_auto(text: str, *, ended: bool = True) -> tuple[str, list[ParsedCall]]:
    """Free text, then (if the model opened one) calls, each of which text may follow ("auto" lets go after a
    call); raises if a call is malformed or a marker stands outside a whole call. A reply that did not end (cut by
    the token limit) may stop inside its last call, which is left out."""
    if not ended and (last := text.rfind("<tool_call>")) > text.rfind("</tool_call>"):
        text = text[:last]
    marker = text.find("<tool_call>")
    if marker < 0:
        return text, []
    blocks = _HERMES_CALL.findall(text[marker:])
    between = _HERMES_CALL.sub("", text[marker:])
    if not blocks or "<tool_call>" in between or "</tool_call>" in between:
        raise AssertionError(f"not free text then hermes calls: {text!r}")
    return text[:marker], [_parse_call(block, "arguments") for block in blocks]


def parse_llama3_call(text: str) -> ParsedCall:
    return _parse_call(text, "parameters")


def _parse_call(text: str, arguments_key: str) -> ParsedCall:
    payload = json.loads(text)
    if not isinstance(payload, dict) or set(payload) != {"name", arguments_key}:
        raise AssertionError(f"call object has the wrong keys: {text!r}")
    return ParsedCall(name=payload["name"], arguments=payload[arguments_key])


def assert_valid_call(call: ParsedCall, tools: Sequence[ToolSpec]) -> None:
    """The call names one of `tools` and its arguments validate against that tool's schema."""
    by_name = {tool.name: tool for tool in tools}
    assert call.name in by_name, f"{call.name!r} is not among {sorted(by_name)}"
    assert isinstance(call.arguments, dict), f"arguments are not an object: {call.arguments!r}"
    jsonschema.validate(call.arguments, by_name[call.name].parameters)
