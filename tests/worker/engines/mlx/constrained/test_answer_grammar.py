"""Structured-output grammar text: which replies it accepts, and the clear errors for what it cannot enforce."""

import pytest

from exo.tool_calls.grammar.spec import JsonAnswerSpec, ReasoningMarkers, UnsupportedConstraintError
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.request_grammar import answer_marker_texts, build_answer_grammar
from exo.worker.engines.mlx.constrained.compiled import guidance_tokenizer
from tests.worker.engines.mlx.constrained.conftest import LoadedModel, grammar_accepts
from tests.worker.engines.mlx.constrained.schemas import SEARCH, WEATHER

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature": {"type": "integer"}},
    "required": ["city", "temperature"],
    "additionalProperties": False,
}
ANSWER = '{"city": "Paris", "temperature": 18}'
CALL_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
CALL_SEARCH = '<tool_call>\n{"name": "search", "arguments": {"query": "x", "limit": 3}}\n</tool_call>'


def _accepts(tool_model: LoadedModel, spec: JsonAnswerSpec, reply: str) -> bool:
    """Whether the model's tokenization of the whole reply is a complete sentence of the grammar for `spec`."""
    guidance = guidance_tokenizer(tool_model[1])
    grammar = build_answer_grammar(spec, special_tokens=guidance.special_tokens(answer_marker_texts(spec)))
    return grammar_accepts(tool_model, grammar, reply)


def _with_tools(*, parallel: bool = True) -> JsonAnswerSpec:
    return JsonAnswerSpec(
        json_schema=ANSWER_SCHEMA,
        tool_format=ToolFormatName.HERMES,
        tools=(WEATHER, SEARCH),
        tool_schemas_enforced=True,
        parallel_tool_calls=parallel,
    )


@pytest.mark.parametrize(
    ("reply", "accepted"),
    [
        (ANSWER, True),
        ('{"city": "Paris"}', False),
        ('{"city": "Paris", "temperature": 18, "extra": 1}', False),
        ('{"city": "Paris", "temperature": 18.5}', False),
        (f"{ANSWER}\n", False),
        (f"Here it is: {ANSWER}", False),
        ("[]", False),
    ],
)
def test_only_json_valid_against_the_schema_is_a_reply(tool_model: LoadedModel, reply: str, accepted: bool) -> None:
    assert _accepts(tool_model, JsonAnswerSpec(json_schema=ANSWER_SCHEMA), reply) is accepted


def test_json_object_mode_accepts_any_object_and_nothing_else(tool_model: LoadedModel) -> None:
    spec = JsonAnswerSpec(json_schema={"type": "object"})
    assert _accepts(tool_model, spec, '{"anything": [1, {"nested": null}]}')
    assert not _accepts(tool_model, spec, "[1]")
    assert not _accepts(tool_model, spec, '"text"')


def test_with_auto_tools_the_reply_is_calls_or_the_answer_but_never_prose(tool_model: LoadedModel) -> None:
    spec = _with_tools()
    assert _accepts(tool_model, spec, ANSWER)
    assert _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_SEARCH}")
    assert not _accepts(tool_model, spec, "Paris is sunny.")
    assert not _accepts(tool_model, spec, f"Let me check.\n{CALL_WEATHER}")
    assert not _accepts(tool_model, spec, f"{ANSWER}\n{CALL_WEATHER}")
    assert not _accepts(tool_model, spec, CALL_WEATHER.replace('"celsius"', '"kelvin"'))


def test_without_parallel_calls_one_call_stands_in_for_the_answer(tool_model: LoadedModel) -> None:
    spec = _with_tools(parallel=False)
    assert _accepts(tool_model, spec, CALL_WEATHER)
    assert not _accepts(tool_model, spec, f"{CALL_WEATHER}\n{CALL_SEARCH}")


def test_non_strict_tools_take_any_object_arguments(tool_model: LoadedModel) -> None:
    spec = _with_tools().model_copy(update={"tool_schemas_enforced": False})
    assert _accepts(tool_model, spec, CALL_WEATHER.replace('"celsius"', '"kelvin"'))
    assert not _accepts(tool_model, spec, CALL_WEATHER.replace("get_weather", "delete_everything"))


def test_reasoning_is_free_and_the_answer_follows(tool_model: LoadedModel) -> None:
    spec = JsonAnswerSpec(json_schema=ANSWER_SCHEMA, reasoning=ReasoningMarkers(start="<think>", end="</think>"))
    assert _accepts(tool_model, spec, f"<think>\nFree {{ text [ here.\n</think>\n\n{ANSWER}")
    assert _accepts(tool_model, spec, ANSWER)
    assert not _accepts(tool_model, spec, "<think>\nhmm\n</think>\n\nIt is sunny.")


@pytest.mark.parametrize(
    ("schema", "strict", "needle"),
    [
        ({"type": "array", "uniqueItems": True}, True, 'Unimplemented keys: ["uniqueItems"]'),
        ({"$ref": "#/$defs/missing"}, False, "'/$defs/missing' does not exist"),
        ({"type": "string", "pattern": "^a(?=b)"}, False, "look-around"),
    ],
)
def test_a_schema_the_grammar_cannot_enforce_is_refused_naming_the_problem(
    schema: dict[str, object], strict: bool, needle: str
) -> None:
    with pytest.raises(UnsupportedConstraintError) as raised:
        build_answer_grammar(JsonAnswerSpec(json_schema=schema, every_keyword_enforced=strict))
    message = str(raised.value)
    assert message.startswith("llguidance rejects the response_format schema: ")
    assert needle in message
    assert "%llguidance" not in message, "the grammar echo (the whole schema again) is left out"


def test_without_strict_an_unenforceable_keyword_is_skipped_not_refused() -> None:
    assert "uniqueItems" in build_answer_grammar(JsonAnswerSpec(json_schema={"type": "array", "uniqueItems": True}))


def test_every_format_offers_its_calls_beside_the_answer() -> None:
    grammar = build_answer_grammar(
        JsonAnswerSpec(json_schema=ANSWER_SCHEMA, tool_format=ToolFormatName.MISTRAL, tools=(WEATHER,))
    )
    assert "answer | " in grammar
    assert "[TOOL_CALLS]" in grammar
