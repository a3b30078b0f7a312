"""Arguments nested past what Python's JSON parser or a schema validator recurses are text that does not check, never
an exception: a model's own output (under a recursive schema the grammar lets it nest without end) and the calls in
a conversation's history are the client's choice, and these readers run on every request's path."""

import pytest
from pydantic import JsonValue

from exo.tool_calls.arguments.schema import validation_errors
from exo.tool_calls.arguments.text_values import convert_xml_value
from exo.tool_calls.grammar.exclusion import excluding
from exo.tool_calls.loop_guard import CallKey, canonical_arguments, error_result
from exo.worker.engines.mlx.chat_messages import arguments_as_object

TREE: dict[str, JsonValue] = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}


def nested_arguments(levels: int) -> str:
    return '{"children": [' * levels + "{}" + "]}" * levels


@pytest.mark.parametrize("levels", [400, 5_000, 100_000])
def test_deep_arguments_under_a_recursive_schema_are_reported_not_raised(levels: int) -> None:
    errors = validation_errors(nested_arguments(levels), TREE)

    assert errors, "arguments that could not be checked are not taken as valid"
    assert "nest deeper" in errors[0]


def test_shallow_arguments_under_the_same_schema_still_validate() -> None:
    assert validation_errors(nested_arguments(20), TREE) == []
    assert validation_errors('{"children": 3}', TREE) != []


@pytest.mark.parametrize("levels", [5_000, 100_000])
def test_the_loop_guard_and_the_template_keep_deep_history_arguments_as_text(levels: int) -> None:
    text = "[" * levels + "]" * levels

    assert canonical_arguments(text) == text
    assert arguments_as_object(text) == text
    assert error_result(text) is False
    assert excluding(TREE, [CallKey(name="f", arguments=text)]) is None


def test_a_deep_parameter_value_of_a_tagged_call_stays_text() -> None:
    text = "[" * 5_000 + "]" * 5_000

    assert convert_xml_value(text, None) == text
