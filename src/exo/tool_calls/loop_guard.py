"""The agent-loop guard: calls the model repeats although their results are already in the conversation.

The server sees the whole conversation on every request, so it can tell when a model is about to issue a call it
has already made and been answered (small models re-issue one write dozens of times), or swings between two calls
(A, B, A, B). Two findings, both from the history of the request and the calls of the reply:

- a *repeat*: a reply's call with the same name and arguments as a call whose result is in the history;
- a *ping-pong*: the reply's calls are those of two call turns back, after that turn and the last one alternated.

`block` does not wait for the reply: `blocked_calls` names the calls the grammar forbids outright, which are the
answered calls of the latest call turn (an immediate repeat can only be given the same answer) and, after an
A-B-A alternation, B's calls. An identical call after other calls in between (reading a file again after editing
it) is reported under `warn` but never blocked: something may have changed since. `excluding` writes the schema
that forbids a blocked call's exact arguments while leaving every other value of the tool's schema allowed.

`answer` takes back the same calls (`withdrawn_calls`), counted only since the user last spoke (a user asking for
the same call again is no loop), and lets the model answer in text instead, which ends an agent's loop.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, cast

from pydantic import JsonValue

from exo.shared.types.chunks import ParsedChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.common import FrozenModel
from exo.shared.types.tasks import PromptMessage

_NON_STRING: Final = ["number", "integer", "boolean", "null", "object", "array"]
_NON_NUMBER: Final = ["string", "boolean", "null", "object", "array"]
_NON_BOOLEAN: Final = ["number", "integer", "string", "null", "object", "array"]
_NON_NULL: Final = ["number", "integer", "boolean", "string", "object", "array"]
_NON_OBJECT: Final = ["number", "integer", "boolean", "string", "null", "array"]
_NON_ARRAY: Final = ["number", "integer", "boolean", "string", "null", "object"]
_EXACT_STRING_LIMIT: Final = 128
"""The longest string value a block excludes; a call with a longer one is only reported."""
_EXACT_VALUE_LIMIT: Final = 64
"""The most values (objects, arrays and what they hold) a block excludes; a call with more is only reported."""
_INDIRECT: Final = frozenset({"$ref", "anyOf", "oneOf", "allOf"})
"""Keywords that put an object's declared properties out of a plain reading of its schema."""
_CLASS_SPECIALS: Final = frozenset("]^-[")
_REGEX_SPECIALS: Final = frozenset(".+*?()|[]{}^$#&~-")


class CallKey(FrozenModel):
    """A call as the guard compares it: its name and its arguments as canonical JSON (keys sorted)."""

    name: str
    arguments: str

    @classmethod
    def of(cls, name: str, arguments: Mapping[str, object] | str) -> "CallKey":
        return cls(name=name, arguments=canonical_arguments(arguments))

    def describe(self) -> str:
        return f"{self.name}({self.arguments})"


def canonical_arguments(arguments: Mapping[str, object] | str) -> str:
    """Arguments as sorted compact JSON; text that is not a JSON object is kept as written."""
    value: object = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
    if not isinstance(value, dict):
        return arguments if isinstance(arguments, str) else json.dumps(value, sort_keys=True)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class CallHistory(FrozenModel):
    """What the guard reads from a conversation."""

    answered: frozenset[CallKey] = frozenset()
    """Every call whose result (a `tool` message with its id) is in the history."""
    turns: tuple[frozenset[CallKey], ...] = ()
    """The calls of each assistant turn that made calls, oldest first."""
    turns_since_user: int = 0
    """How many of `turns` came after the user last spoke. A user message right after tool results is read as part
    of them (Claude Code sends reminders as text beside its tool results), not as the user speaking."""

    @classmethod
    def of(cls, messages: Iterable[PromptMessage]) -> "CallHistory":
        listed = list(messages)
        answered_ids = {message.tool_call_id for message in listed if message.role == "tool" and message.tool_call_id}
        answered: set[CallKey] = set()
        turns: list[frozenset[CallKey]] = []
        since_user = 0
        for previous, message in zip([None, *listed], listed, strict=False):
            if message.role == "user" and (previous is None or previous.role != "tool"):
                since_user = 0
            if message.role != "assistant" or not message.tool_calls:
                continue
            keys = {call.call_id: CallKey.of(call.name, call.arguments) for call in message.tool_calls}
            turns.append(frozenset(keys.values()))
            since_user += 1
            answered.update(key for call_id, key in keys.items() if call_id in answered_ids)
        return cls(answered=frozenset(answered), turns=tuple(turns), turns_since_user=since_user)

    def blocked_calls(self) -> tuple[CallKey, ...]:
        """The calls `block` forbids: the latest call turn's answered calls, and B's after A-B-A."""
        return self._looping(self.turns)

    def withdrawn_calls(self) -> tuple[CallKey, ...]:
        """The calls `answer` takes back: those `block` forbids, among the turns since the user last spoke."""
        return self._looping(self.turns[len(self.turns) - self.turns_since_user :])

    def _looping(self, turns: Sequence[frozenset[CallKey]]) -> tuple[CallKey, ...]:
        if not turns:
            return ()
        candidates = set(turns[-1])
        if _alternating(turns):
            candidates |= turns[-2]
        return tuple(sorted(candidates & self.answered, key=lambda key: (key.name, key.arguments)))

    def findings(self, calls: Sequence[CallKey]) -> tuple[str, ...]:
        """What `warn` reports about a reply that made `calls`."""
        found = [f"repeated call {call.describe()}: its result is already in the conversation" for call in calls]
        found = [text for call, text in zip(calls, found, strict=True) if call in self.answered]
        if calls and _alternating(self.turns) and frozenset(calls) == self.turns[-2]:
            found.append("ping-pong: the reply repeats the calls of two turns back after A-B-A")
        return tuple(found)


def _alternating(turns: Sequence[frozenset[CallKey]]) -> bool:
    """The last three call turns went A, B, A (A ≠ B): B next would make it A-B-A-B."""
    return len(turns) >= 3 and turns[-3] == turns[-1] != turns[-2]


class ReplyCalls:
    """The calls of a reply, assembled from its parsed chunks as they go by."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._arguments: dict[int, list[str]] = {}

    def add(self, chunks: Iterable[ParsedChunk]) -> None:
        for chunk in chunks:
            if isinstance(chunk, ToolCallChunk):
                self._names[chunk.index] = chunk.name
                self._arguments[chunk.index] = []
            elif isinstance(chunk, ToolCallArgumentsChunk) and chunk.index in self._arguments:
                self._arguments[chunk.index].append(chunk.fragment)

    def keys(self) -> list[CallKey]:
        return [CallKey.of(self._names[index], "".join(self._arguments[index])) for index in sorted(self._names)]


def excluding(parameters: Mapping[str, JsonValue], blocked: Sequence[CallKey]) -> dict[str, JsonValue] | None:
    """`parameters` narrowed so that none of the `blocked` argument objects validates (every other value that did
    still does, but see `_string_differs`), or None when some blocked call cannot be excluded this way (arguments
    that are not an object, or past the limits of `_value_differs`: the guard then only reports those)."""
    differences: list[JsonValue] = []
    for call in blocked:
        difference = _differs(parameters, call.arguments)
        if difference is None:
            return None
        differences.append(difference)
    if not differences:
        return dict(parameters)
    return {"allOf": [dict(parameters), *differences]}


def _differs(parameters: Mapping[str, JsonValue], arguments: str) -> JsonValue | None:
    """A schema matching exactly the argument objects that differ from `arguments` (see `_object_differs`)."""
    try:
        value: object = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(value, dict) or _values_in(value) > _EXACT_VALUE_LIMIT:
        return None
    if not value and not _declared(parameters):
        return {"anyOf": [{"minProperties": 1}]}  # a tool without declared arguments: any argument at all differs
    return _object_differs(parameters, cast(dict[str, object], value))


def _object_differs(schema: Mapping[str, JsonValue], given: Mapping[str, object]) -> JsonValue | None:
    """The objects that differ from `given` in a key `schema` names: a value changed, a key left out, or another of
    the schema's declared properties added (nested objects and arrays compared the same way, value by value)."""
    declared = _declared(schema)
    alternatives: list[JsonValue] = []
    for key, item in given.items():
        changed = _value_differs(declared.get(key, {}), item)
        if changed is None:
            return None
        alternatives.append({"properties": {key: changed}, "required": [key]})
        alternatives.append({"properties": {key: False}})
    for key in declared:
        if key not in given:
            alternatives.append({"required": [key]})
    # No alternative: an empty nested object where no property is declared ("minProperties" is no way out: in
    # llguidance an object of two declared properties failed "minProperties": 2).
    return {"anyOf": alternatives} if alternatives else None


def _value_differs(schema: JsonValue, value: object) -> JsonValue | None:
    if value is None:
        return {"type": list(_NON_NULL)}
    if isinstance(value, bool):
        return {"anyOf": [{"type": list(_NON_BOOLEAN)}, {"const": not value}]}
    if isinstance(value, int | float):
        return {
            "anyOf": [
                {"type": list(_NON_NUMBER)},
                {"type": "number", "exclusiveMaximum": value},
                {"type": "number", "exclusiveMinimum": value},
            ]
        }
    if isinstance(value, str) and "\\" not in value:
        # (A backslash in the value: llguidance's string patterns do not exclude it reliably, so no block.)
        differs = _string_differs(value)
        return {"anyOf": [{"type": list(_NON_STRING)}, differs]} if differs is not None else None
    if isinstance(value, dict):
        if isinstance(schema, dict) and _INDIRECT.intersection(schema):
            return None  # its declared properties are not in sight: an added one would not count as a difference
        inner = _object_differs(schema if isinstance(schema, dict) else {}, cast(dict[str, object], value))
        return (
            {"anyOf": [{"type": list(_NON_OBJECT)}, {"type": "object", **inner}]} if isinstance(inner, dict) else None
        )
    if isinstance(value, list):
        return _array_differs(schema, cast(list[object], value))
    return None


def _array_differs(schema: JsonValue, items: Sequence[object]) -> JsonValue | None:
    """The values other than the array `items`: another type, fewer or more items, or an item changed."""
    item_schema: JsonValue = schema.get("items", {}) if isinstance(schema, dict) else {}
    alternatives: list[JsonValue] = [{"type": list(_NON_ARRAY)}, {"type": "array", "minItems": len(items) + 1}]
    if items:
        alternatives.append({"type": "array", "maxItems": len(items) - 1})
    for position, item in enumerate(items):
        changed = _value_differs(item_schema, item)
        if changed is None:
            return None
        prefix: list[JsonValue] = [{} for _ in range(position)]
        alternatives.append({"type": "array", "minItems": position + 1, "prefixItems": [*prefix, changed]})
    return {"anyOf": alternatives}


def _values_in(value: object) -> int:
    """How many values `value` holds, itself included (the size of the schema that excludes it)."""
    if isinstance(value, dict):
        return 1 + sum(_values_in(item) for item in cast(dict[str, object], value).values())
    if isinstance(value, list):
        return 1 + sum(_values_in(item) for item in cast(list[object], value))
    return 1


def _declared(schema: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    properties = schema.get("properties")
    return dict(properties) if isinstance(properties, dict) else {}


def _string_differs(text: str) -> JsonValue | None:
    """The schema of the strings other than `text`, or None past `_EXACT_STRING_LIMIT` characters (the regex of
    an exact difference grows with the square of the string's length)."""
    if len(text) > _EXACT_STRING_LIMIT:
        return None
    return {"type": "string", "pattern": f"^{_other_than(text)}$"}


def _other_than(text: str) -> str:
    """A regex for the strings that differ from `text`: a proper prefix of it, a string that leaves it at some
    position, or `text` followed by more. Flat alternatives, not nested groups: the regex parser behind llguidance
    limits nesting (and a pattern it rejects goes unenforced)."""
    prefixes = ["".join(map(_literal, text[:end])) for end in range(len(text) + 1)]
    options = [*prefixes[:-1], *(rf"{prefixes[at]}[^{_in_class(c)}][\s\S]*" for at, c in enumerate(text))]
    return "(" + "|".join([*options, rf"{prefixes[-1]}[\s\S]+"]) + ")"


def _literal(character: str) -> str:
    return f"\\{character}" if character in _REGEX_SPECIALS else _printable(character)


def _in_class(character: str) -> str:
    return f"\\{character}" if character in _CLASS_SPECIALS else _printable(character)


def _printable(character: str) -> str:
    """Control characters as hex escapes, so the pattern stays readable."""
    return f"\\x{{{ord(character):x}}}" if ord(character) < 0x20 else character


def withdrawal_finding(call: CallKey) -> str:
    """What `answer` reports about a call it took back."""
    return (
        f"repeated call {call.describe()} withdrawn: its result is already in the conversation, so the reply was "
        "decoded again without calls"
    )


def repeated(history: CallHistory, calls: Sequence[CallKey]) -> int:
    """How many of `calls` repeat an answered call (what /metrics counts)."""
    return sum(call in history.answered for call in calls)
