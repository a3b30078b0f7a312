"""Every format's grammar against its own model text: what the conformance renderers write (each family's
template layout) is accepted under `required`, text that is no call is refused there, `tool_choice: "none"`
refuses the call and accepts prose, and strict "auto" takes either. Each case runs with the markers as added
tokens (the real tokenizers) and spelled out in ordinary pieces."""

import json

import pytest

from exo.conformance.renderers import RENDERERS, SampleCall
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.spec import ReplyShape, ToolConstraintSpec, UnsupportedConstraintError
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.request_grammar import build_tool_grammar, tool_marker_texts
from tests.tool_calls.grammar.tokenizers import format_tokenizer

WEATHER = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
PARIS = SampleCall(name="get_weather", arguments={"city": "Paris"})
ROME = SampleCall(name="get_weather", arguments={"city": "Rome", "days": 3})
UNKNOWN = SampleCall(name="get_stock_price", arguments={"city": "Paris"})
PROSE = "It is sunny in Paris today."
# One call per reply: Llama 3.1 JSON has no parallel form; GPT-OSS ends its turn on each call.
_SINGLE_CALL_FORMATS = frozenset({ToolFormatName.LLAMA3_JSON, ToolFormatName.HARMONY})
FORMATS = [name for name in ToolFormatName if name is not ToolFormatName.GENERIC]
TOKENIZATIONS = [True, False]


def render(tool_format: ToolFormatName, calls: list[SampleCall], markers_are_tokens: bool) -> str:
    """The model text the grammar writes for `calls` (the renderer's, less what a real model stops on)."""
    if tool_format is ToolFormatName.LLAMA3_JSON:
        text = RENDERERS[tool_format](calls).removesuffix("<|eom_id|>")
        return text if markers_are_tokens else text.removeprefix("<|python_tag|>")
    if tool_format is ToolFormatName.HARMONY:
        return RENDERERS[tool_format](calls).removesuffix("<|call|>")
    if tool_format is ToolFormatName.PYTHONIC:
        # The grammar writes values as JSON literals (which Python reads the same), not Python's repr.
        listed = (
            "["
            + ", ".join(
                f"{call.name}({', '.join(f'{key}={json.dumps(value)}' for key, value in call.arguments.items())})"
                for call in calls
            )
            + "]"
        )
        return f"<|tool_call_start|>{listed}<|tool_call_end|>" if markers_are_tokens else listed
    if tool_format is ToolFormatName.MISTRAL and markers_are_tokens:
        return "".join(f"[TOOL_CALLS]{call.name}[ARGS]{_json(call)}" for call in calls)
    return RENDERERS[tool_format](calls)


def _json(call: SampleCall) -> str:
    return json.dumps(dict(call.arguments))


def grammar(tool_format: ToolFormatName, shape: ReplyShape, markers_are_tokens: bool) -> str:
    spec = ToolConstraintSpec(
        tool_format=tool_format,
        tools=() if shape is ReplyShape.TEXT_ONLY else (WEATHER,),
        shape=shape,
        parallel_tool_calls=True,
    )
    tokenizer = format_tokenizer(tool_format, markers_are_tokens)
    texts = tool_marker_texts(spec)
    return build_tool_grammar(spec, special_tokens={t: i for t, i in tokenizer.special_tokens.items() if t in texts})


@pytest.mark.parametrize("markers_are_tokens", TOKENIZATIONS)
@pytest.mark.parametrize("tool_format", FORMATS)
def test_required_accepts_the_format_s_own_calls_and_nothing_else(
    tool_format: ToolFormatName, markers_are_tokens: bool
) -> None:
    tokenizer = format_tokenizer(tool_format, markers_are_tokens)
    required = grammar(tool_format, ReplyShape.CALLS, markers_are_tokens)
    assert tokenizer.accepts(required, render(tool_format, [PARIS], markers_are_tokens))
    assert tokenizer.accepts(required, render(tool_format, [ROME], markers_are_tokens))
    if tool_format not in _SINGLE_CALL_FORMATS:
        assert tokenizer.accepts(required, render(tool_format, [PARIS, ROME], markers_are_tokens))
    assert not tokenizer.accepts(required, PROSE)
    assert not tokenizer.accepts(required, render(tool_format, [UNKNOWN], markers_are_tokens))
    missing_city = SampleCall(name="get_weather", arguments={"days": 3})
    assert not tokenizer.accepts(required, render(tool_format, [missing_city], markers_are_tokens))


@pytest.mark.parametrize("markers_are_tokens", TOKENIZATIONS)
@pytest.mark.parametrize("tool_format", FORMATS)
def test_none_refuses_the_call_and_accepts_prose(tool_format: ToolFormatName, markers_are_tokens: bool) -> None:
    tokenizer = format_tokenizer(tool_format, markers_are_tokens)
    none = grammar(tool_format, ReplyShape.TEXT_ONLY, markers_are_tokens)
    answer = f"<|channel|>final<|message|>{PROSE}" if tool_format is ToolFormatName.HARMONY else PROSE
    assert tokenizer.accepts(none, answer)
    assert not tokenizer.accepts(none, render(tool_format, [PARIS], markers_are_tokens))
    # Bare forms (a reply that starts as a call) are calls only at the start; marked ones anywhere.
    bare = not markers_are_tokens and tool_format in (ToolFormatName.LLAMA3_JSON, ToolFormatName.PYTHONIC)
    if tool_format is not ToolFormatName.HARMONY and not bare:
        assert not tokenizer.accepts(none, f"{PROSE}\n{render(tool_format, [PARIS], markers_are_tokens)}")


@pytest.mark.parametrize("markers_are_tokens", TOKENIZATIONS)
@pytest.mark.parametrize("tool_format", FORMATS)
def test_strict_auto_takes_prose_or_checked_calls(tool_format: ToolFormatName, markers_are_tokens: bool) -> None:
    tokenizer = format_tokenizer(tool_format, markers_are_tokens)
    auto = grammar(tool_format, ReplyShape.TEXT_OR_CALLS, markers_are_tokens)
    answer = f"<|channel|>final<|message|>{PROSE}" if tool_format is ToolFormatName.HARMONY else PROSE
    assert tokenizer.accepts(auto, answer)
    assert tokenizer.accepts(auto, render(tool_format, [PARIS], markers_are_tokens))
    unknown = render(tool_format, [UNKNOWN], markers_are_tokens)
    # A bare opening is a call only once it names an offered tool: before that it is text (which the parser then
    # hands back as content), so prose is never forced into a call. A marked call is a call from its marker.
    bare = not markers_are_tokens and tool_format in (ToolFormatName.LLAMA3_JSON, ToolFormatName.PYTHONIC)
    assert tokenizer.accepts(auto, unknown) is bare


# Text that begins like JSON or a list but is no call to an offered tool: a user may ask for exactly this.
PROSE_LIKE_CALLS = [
    '{"a": 1}',
    '{"name": "Bob", "age": 3}',
    "[1, 2] are the numbers.",
    "[the docs](https://example.com) say so.",
    "[get_stock_price(city=1)] is not a tool.",
]


@pytest.mark.parametrize("markers_are_tokens", TOKENIZATIONS)
@pytest.mark.parametrize("tool_format", FORMATS)
def test_auto_keeps_prose_that_starts_with_a_brace_or_a_bracket(
    tool_format: ToolFormatName, markers_are_tokens: bool
) -> None:
    tokenizer = format_tokenizer(tool_format, markers_are_tokens)
    auto = grammar(tool_format, ReplyShape.TEXT_OR_CALLS, markers_are_tokens)
    for text in PROSE_LIKE_CALLS:
        answer = f"<|channel|>final<|message|>{text}" if tool_format is ToolFormatName.HARMONY else text
        assert tokenizer.accepts(auto, answer), text


# (format, bare reply that is a valid call, the same call with arguments that break the schema)
BARE_CALLS = [
    (
        ToolFormatName.HERMES,
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '{"name": "get_weather", "arguments": {"city": 5}}',
    ),
    (
        ToolFormatName.HERMES,
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n```',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "two"}}\n```',
    ),
    (
        ToolFormatName.HERMES,
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {}}]',
    ),
    (
        ToolFormatName.LLAMA3_JSON,
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"town": "Paris"}}',
    ),
    (ToolFormatName.PYTHONIC, '[get_weather(city="Paris", days=3)]', "[get_weather(city=3)]"),
    (
        ToolFormatName.PYTHONIC,
        '[get_weather(city="Paris"), get_weather(city="Rome")]',
        '[get_weather(city="Paris"), get_weather(days=1)]',
    ),
]


@pytest.mark.parametrize(("tool_format", "valid", "invalid"), BARE_CALLS)
def test_auto_holds_a_bare_call_to_its_schema_once_it_names_a_tool(
    tool_format: ToolFormatName, valid: str, invalid: str
) -> None:
    for markers_are_tokens in TOKENIZATIONS:
        tokenizer = format_tokenizer(tool_format, markers_are_tokens)
        auto = grammar(tool_format, ReplyShape.TEXT_OR_CALLS, markers_are_tokens)
        assert tokenizer.accepts(auto, valid)
        assert not tokenizer.accepts(auto, invalid)
        # In the JSON formats text may not open with an object keyed "arguments": the parser reads that as a call.
        keyed_arguments = '{"arguments": {"city": "Paris"}, "name": "get_weather"}'
        assert tokenizer.accepts(auto, keyed_arguments) is (tool_format is ToolFormatName.PYTHONIC)


def test_auto_leaves_a_schema_the_grammar_cannot_hold_to_validation_but_strict_refuses_it() -> None:
    broken = ToolSpec(name="broken", parameters={"type": "object", "properties": {"x": {"$ref": "#/nope"}}})
    tokenizer = format_tokenizer(ToolFormatName.HERMES, True)
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES,
        tools=(WEATHER, broken),
        shape=ReplyShape.TEXT_OR_CALLS,
        parallel_tool_calls=True,
    )
    auto = build_tool_grammar(spec, special_tokens=tokenizer.special_tokens)
    # The other tool stays held to its schema; the broken one takes any arguments object.
    assert tokenizer.accepts(auto, '<tool_call>\n{"name": "broken", "arguments": {"x": [1]}}\n</tool_call>')
    assert not tokenizer.accepts(auto, '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}\n</tool_call>')
    strict = spec.model_copy(update={"tools": (WEATHER, broken.model_copy(update={"strict": True}))})
    with pytest.raises(UnsupportedConstraintError):
        build_tool_grammar(strict, special_tokens=tokenizer.special_tokens)
