"""The pure schema checks: what no validator can evaluate, what no finite value satisfies, and what is fine."""

import time

import pytest

from exo.api.adapters.schema_termination import (
    CheckBudget,
    as_tool_parameters,
    self_application_cycle,
    unfinishable_reason,
)
from exo.shared.types.api import JsonObject

SELF_REFERENCE: JsonObject = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
NEXT_REQUIRED: JsonObject = {
    "type": "object",
    "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
    "required": ["value", "next"],
}
MUTUALLY_REQUIRED: JsonObject = {
    "$defs": {
        "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
        "b": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]},
    },
    "$ref": "#/$defs/a",
}
TREE: JsonObject = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value", "children"],
        }
    },
    "$ref": "#/$defs/node",
}


def cycle(schema: object) -> str | None:
    return self_application_cycle(schema, CheckBudget())


def unfinishable(schema: object) -> str | None:
    return unfinishable_reason(schema, CheckBudget())


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (SELF_REFERENCE, "'#/$defs/a' → '#/$defs/a'"),
        ({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, "'#' → '#'"),
        ({"allOf": [{"$ref": "#/$defs/b"}], "$defs": {"b": {"not": {"$ref": "#"}}}}, "'#' → '#/$defs/b' → '#'"),
        (
            {
                "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}},
                "properties": {"p": {"$ref": "#/$defs/x"}},
            },
            "'#/$defs/y' → '#/$defs/x' → '#/$defs/y'",
        ),
    ],
)
def test_a_schema_applying_itself_to_the_same_value_is_found(schema: JsonObject, named: str) -> None:
    found = cycle(schema)
    assert found is not None
    assert named in found


@pytest.mark.parametrize(
    ("schema", "chain"),
    [
        (NEXT_REQUIRED, "required 'next' → $ref '#'"),
        ({"properties": {"next": {"$ref": "#"}}, "required": ["next"]}, "required 'next' → $ref '#'"),
        (MUTUALLY_REQUIRED, "$ref '#/$defs/a' → required 'b' → $ref '#/$defs/b' → required 'a'"),
        ({"type": "array", "minItems": 1, "items": {"$ref": "#"}}, "item 0 → $ref '#'"),
        ({"type": "object", "properties": {"x": {"enum": []}}, "required": ["x"]}, "required 'x' → enum []"),
        ({"type": "object", "additionalProperties": False, "required": ["x"]}, "required 'x' → false"),
        (SELF_REFERENCE, "$ref '#/$defs/a'"),
    ],
)
def test_a_schema_no_finite_value_satisfies_is_found_with_its_chain(schema: JsonObject, chain: str) -> None:
    found = unfinishable(as_tool_parameters(schema))
    assert found is not None
    assert chain in found


@pytest.mark.parametrize(
    "schema",
    [
        TREE,  # recursive, but an empty list of children ends it
        {"type": "object", "properties": {"next": {"$ref": "#"}}},  # next is optional
        {"type": ["object", "null"], "properties": {"next": {"$ref": "#"}}, "required": ["next"]},  # null ends it
        {"anyOf": [{"type": "string"}, NEXT_REQUIRED]},
        {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]},
        {"type": "object", "default": {"$ref": "#"}, "examples": [{"$ref": "#"}]},  # data, not schemas
        {"$ref": "#/$defs/missing"},  # unresolvable: the grammar compiler names that
        {"$ref": "https://example.com/schema.json"},
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ],
)
def test_schemas_with_finite_values_pass_both_checks(schema: JsonObject) -> None:
    assert cycle(schema) is None
    assert unfinishable(as_tool_parameters(schema)) is None


def test_a_tool_schema_that_names_no_type_is_an_object_as_the_grammar_makes_it() -> None:
    schema: JsonObject = {"properties": {"next": {"$ref": "#"}}, "required": ["next"]}
    assert unfinishable(schema) is None  # as plain JSON Schema, null satisfies it
    assert unfinishable(as_tool_parameters(schema)) is not None


def test_a_long_chain_of_definitions_is_checked_in_linear_time() -> None:
    definitions: JsonObject = {
        f"d{index}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{index + 1}"}, "b": {"$ref": f"#/$defs/d{index + 1}"}},
            "required": ["a", "b"],
        }
        for index in range(1000)
    }
    definitions["d1000"] = {"type": "string"}
    schema: JsonObject = {"$defs": definitions, "$ref": "#/$defs/d0"}
    started = time.monotonic()
    assert cycle(schema) is None
    assert unfinishable(schema) is None
    # ~10,000 nodes: linear work is a few hundredths of a second; re-walking the chain per definition is ~1000x that.
    assert time.monotonic() - started < 5


def test_a_schema_too_large_to_check_within_the_budget_is_left_to_the_grammar() -> None:
    budget = CheckBudget(nodes=10)
    assert self_application_cycle(SELF_REFERENCE | {"properties": {str(n): {} for n in range(20)}}, budget) is None


def test_nesting_deeper_than_python_recursion_is_no_crash() -> None:
    deep: JsonObject = {"type": "string"}
    for _ in range(5000):
        deep = {"anyOf": [deep]}
    assert cycle(deep) is None
    assert unfinishable(deep) is None
