"""The schema that rules out given argument objects: what a repair's grammar excludes so a failed call is not
written again word for word (`policy.repair_spec`).

Only what JSON Schema can say exactly, and what llguidance enforces, is excluded: argument objects without long
strings, backslashes or too many values, in a format whose arguments are one JSON object (`policy.blockable`);
otherwise `excluding` says it cannot.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Final, cast

from pydantic import JsonValue

from exo.tool_calls.loop_guard import CallKey

_NON_STRING: Final = ["number", "integer", "boolean", "null", "object", "array"]
_NON_NUMBER: Final = ["string", "boolean", "null", "object", "array"]
_NON_BOOLEAN: Final = ["number", "integer", "string", "null", "object", "array"]
_NON_NULL: Final = ["number", "integer", "boolean", "string", "object", "array"]
_NON_OBJECT: Final = ["number", "integer", "boolean", "string", "null", "array"]
_NON_ARRAY: Final = ["number", "integer", "boolean", "string", "null", "object"]
_EXACT_STRING_LIMIT: Final = 128
"""The longest string value an exclusion rules out; a call with a longer one cannot be excluded."""
_EXACT_VALUE_LIMIT: Final = 64
"""The most values (objects, arrays and what they hold) an exclusion rules out; a call with more cannot be excluded."""
_INDIRECT: Final = frozenset({"$ref", "anyOf", "oneOf", "allOf"})
"""Keywords that put an object's declared properties out of a plain reading of its schema."""
_CLASS_SPECIALS: Final = frozenset("]^-[")
_REGEX_SPECIALS: Final = frozenset(".+*?()|[]{}^$#&~-")


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
    except (ValueError, RecursionError):
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
