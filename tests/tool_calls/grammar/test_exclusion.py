"""The schema that excludes a call's exact arguments (the repair of a failed call re-decodes under it), run through
llguidance with a real tokenizer, so "excluded" means the grammar cannot write it. What the loop guard reads from a
conversation is tested in test_call_history.py."""

import json
from collections.abc import Mapping

import pytest
from pydantic import JsonValue

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.exclusion import excluding
from exo.tool_calls.grammar.spec import ReplyShape, ToolConstraintSpec
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName
from exo.tool_calls.request_grammar import build_tool_grammar
from tests.tool_calls.grammar.tokenizers import format_tokenizer

WRITE = ToolSpec(
    name="write",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "mode": {"type": "integer"},
            "append": {"type": "boolean"},
        },
        "required": ["path", "content"],
    },
)
HELLO: dict[str, object] = {"path": "hello.txt", "content": "hello"}


def _grammar_accepts(base: ToolSpec, parameters: Mapping[str, object], arguments: dict[str, object]) -> bool:
    """Whether the grammar for `base` with `parameters` can write the call."""
    tool = base.model_copy(update={"parameters": parameters})
    # llguidance writes properties in schema order: keep the call's keys in that order.
    order = list(base.parameters["properties"])  # pyright: ignore[reportArgumentType] -- a dict of properties
    arguments = dict(sorted(arguments.items(), key=lambda item: order.index(item[0])))
    tokenizer = format_tokenizer(ToolFormatName.HERMES, True)
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(tool,), shape=ReplyShape.TEXT_OR_CALLS, parallel_tool_calls=True
    )
    grammar = build_tool_grammar(spec, special_tokens=tokenizer.special_tokens)
    call = {"name": base.name, "arguments": arguments}
    return tokenizer.accepts(grammar, f"<tool_call>\n{json.dumps(call)}\n</tool_call>")


def _accepts_call(parameters: Mapping[str, object], arguments: dict[str, object]) -> bool:
    return _grammar_accepts(WRITE, parameters, arguments)


@pytest.mark.parametrize(
    "blocked",
    [
        HELLO,
        {"path": "hello.txt", "content": "hello", "mode": 420},
        {"path": "a]b^c-d[e/f.g*(h)", "content": "line\nbreak", "append": False},
        {"path": "hello.txt", "content": "x" * 120},
    ],
)
def test_the_excluding_schema_forbids_exactly_the_blocked_arguments(blocked: dict[str, object]) -> None:
    narrowed = excluding(WRITE.parameters, (CallKey.of("write", blocked),))
    assert narrowed is not None
    assert not _accepts_call(narrowed, blocked)
    # The same tool with new arguments: each value changed, a key left out, another key added.
    variants: list[dict[str, object]] = []
    for key, value in blocked.items():
        changed = (value + "!") if isinstance(value, str) else (not value) if isinstance(value, bool) else 7
        variants.append({**blocked, key: changed})
        if key not in ("path", "content"):
            variants.append({name: item for name, item in blocked.items() if name != key})
    variants.append({**blocked, "append": True} if "append" not in blocked else {**blocked, "mode": 1})
    for variant in variants:
        assert _accepts_call(narrowed, variant), variant


def test_arguments_holding_an_empty_undeclared_object_or_a_long_string_are_reported_but_not_blocked() -> None:
    assert excluding(WRITE.parameters, (CallKey.of("write", {"path": "a", "content": "b", "meta": {}}),)) is None
    assert excluding(WRITE.parameters, (CallKey.of("write", {"path": "a", "content": "b" * 200}),)) is None


def test_a_backslash_in_the_arguments_leaves_the_call_to_the_report() -> None:
    assert excluding(WRITE.parameters, (CallKey.of("write", {"path": "C:\\x", "content": "b"}),)) is None


EDIT = ToolSpec(
    name="edit",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["old", "new"],
                },
            },
            "options": {
                "type": "object",
                "properties": {"dry_run": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}}},
            },
        },
        "required": ["path", "edits"],
    },
)
EDIT_CALL: dict[str, object] = {
    "path": "a.py",
    "edits": [{"old": "x = 1", "new": "x = 2"}],
    "options": {"dry_run": False, "tags": ["t1", "t2"]},
}


def _accepts_edit(parameters: Mapping[str, object], arguments: dict[str, object]) -> bool:
    return _grammar_accepts(EDIT, parameters, arguments)


def test_a_call_with_nested_objects_and_arrays_is_blocked_and_every_change_inside_them_allowed() -> None:
    narrowed = excluding(EDIT.parameters, (CallKey.of("edit", EDIT_CALL),))
    assert narrowed is not None
    assert _accepts_edit(EDIT.parameters, EDIT_CALL)
    assert not _accepts_edit(narrowed, EDIT_CALL)
    options = {"dry_run": False, "tags": ["t1", "t2"]}
    variants: list[dict[str, object]] = [
        {**EDIT_CALL, "path": "b.py"},
        {**EDIT_CALL, "edits": [{"old": "x = 1", "new": "x = 3"}]},  # a value inside an array's object
        {**EDIT_CALL, "edits": []},  # fewer items
        {**EDIT_CALL, "edits": [{"old": "x = 1", "new": "x = 2"}, {"old": "y", "new": "z"}]},  # more items
        {**EDIT_CALL, "options": {**options, "dry_run": True}},  # a value inside a nested object
        {**EDIT_CALL, "options": {**options, "tags": ["t1", "t3"]}},  # an item of a nested array
        {**EDIT_CALL, "options": {**options, "tags": ["t1"]}},
        {**EDIT_CALL, "options": {**options, "tags": ["t1", "t2", "t3"]}},
        {**EDIT_CALL, "options": {"tags": ["t1", "t2"]}},  # a nested key left out
        {"path": "a.py", "edits": [{"old": "x = 1", "new": "x = 2"}]},  # a top-level key left out
    ]
    for variant in variants:
        assert _accepts_edit(narrowed, variant), variant


def test_a_nested_declared_key_added_is_a_new_call() -> None:
    blocked: dict[str, object] = {"path": "a.py", "edits": [], "options": {"tags": []}}
    narrowed = excluding(EDIT.parameters, (CallKey.of("edit", blocked),))
    assert narrowed is not None
    assert not _accepts_edit(narrowed, blocked)
    assert _accepts_edit(narrowed, {"path": "a.py", "edits": [], "options": {"dry_run": True, "tags": []}})


def test_nested_values_past_the_limits_are_reported_but_not_blocked() -> None:
    many = {"path": "a.py", "edits": [{"old": str(number), "new": "x"} for number in range(40)]}
    assert excluding(EDIT.parameters, (CallKey.of("edit", many),)) is None
    long_inside = {"path": "a.py", "edits": [{"old": "b" * 200, "new": "x"}]}
    assert excluding(EDIT.parameters, (CallKey.of("edit", long_inside),)) is None
    referenced: dict[str, JsonValue] = {
        "type": "object",
        "properties": {"meta": {"$ref": "#/$defs/meta"}},
        "$defs": {"meta": {}},
    }
    assert excluding(referenced, (CallKey.of("t", {"meta": {"a": 1}}),)) is None
