"""Read a tool's JSON schema where the scanner stands, coerce unambiguous mismatches, validate the result."""

import json
import re
from collections.abc import Mapping
from typing import cast

from jsonschema import SchemaError
from jsonschema.validators import validator_for  # pyright: ignore[reportUnknownVariableType]

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
SchemaDict = Mapping[str, object]

_INTEGER = re.compile(r"-?(?:0|[1-9]\d*)")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_TYPE_OF_CONSTANT: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _as_schema(value: object) -> SchemaDict | None:
    return cast(SchemaDict, value) if isinstance(value, Mapping) else None


def _as_list(value: object) -> list[object]:
    return cast(list[object], value) if isinstance(value, list) else []


class SchemaView:
    """One node of a schema plus the root it came from (to resolve local `$ref`s)."""

    def __init__(self, node: SchemaDict, root: SchemaDict) -> None:
        self._node = self._resolve(node, root)
        self._root = root

    @classmethod
    def of_tool(cls, parameters: SchemaDict) -> "SchemaView":
        return cls(parameters, parameters)

    @staticmethod
    def _resolve(node: SchemaDict, root: SchemaDict) -> SchemaDict:
        # Local refs only (`#/$defs/x`); zod and pydantic emit nothing else. Bounded to stop ref cycles.
        for _ in range(16):
            reference = node.get("$ref")
            if not isinstance(reference, str) or not reference.startswith("#"):
                return node
            target: SchemaDict | None = root
            for part in reference.lstrip("#").strip("/").split("/"):
                target = _as_schema(target.get(part)) if target is not None and part else target
            if target is None:
                return node
            node = target
        return node

    def _branches(self) -> list["SchemaView"]:
        branches: list[SchemaView] = []
        for keyword in ("anyOf", "oneOf", "allOf"):
            for branch in _as_list(self._node.get(keyword)):
                if (schema := _as_schema(branch)) is not None:
                    branches.append(SchemaView(schema, self._root))
        return branches

    def types(self) -> frozenset[str] | None:
        """The JSON types this node allows, or None when it does not say (anything goes)."""
        found: set[str] = set()
        declared = self._node.get("type")
        if isinstance(declared, str):
            found.add(declared)
        found.update(item for item in _as_list(declared) if isinstance(item, str))
        for keyword in ("enum", "const"):
            values = _as_list(self._node.get(keyword)) if keyword == "enum" else [self._node.get("const")]
            if keyword in self._node:
                found.update(_json_type_name(value) for value in values)
        branches = self._branches()
        for branch in branches:
            branch_types = branch.types()
            if branch_types is None and "allOf" not in self._node:
                return None
            found.update(branch_types or ())
        if not found:
            return None
        if "number" in found:
            found.add("integer")
        return frozenset(found)

    def property(self, key: str) -> "SchemaView | None":
        """The schema of object member `key`, if the schema describes it."""
        properties = _as_schema(self._node.get("properties"))
        if properties is not None and (member := _as_schema(properties.get(key))) is not None:
            return SchemaView(member, self._root)
        if (additional := _as_schema(self._node.get("additionalProperties"))) is not None:
            return SchemaView(additional, self._root)
        for branch in self._branches():
            if (found := branch.property(key)) is not None:
                return found
        return None

    def item(self, index: int) -> "SchemaView | None":
        """The schema of array element `index`, if the schema describes it."""
        prefix = _as_list(self._node.get("prefixItems")) or _as_list(self._node.get("items"))
        if index < len(prefix) and (positional := _as_schema(prefix[index])) is not None:
            return SchemaView(positional, self._root)
        if (items := _as_schema(self._node.get("items"))) is not None:
            return SchemaView(items, self._root)
        for branch in self._branches():
            if (found := branch.item(index)) is not None:
                return found
        return None


def _json_type_name(value: object) -> str:
    if value is None:
        return "null"
    for python_type, name in _TYPE_OF_CONSTANT:
        if isinstance(value, python_type):
            return name
    return "string"


def wants_coercion_from_string(view: SchemaView | None) -> bool:
    """True when a string written here may need converting: the schema allows no string but a scalar or container."""
    if view is None:
        return False
    types = view.types()
    return (
        types is not None
        and "string" not in types
        and bool(types & {"integer", "number", "boolean", "object", "array"})
    )


def coerce_string(text: str, view: SchemaView) -> JsonValue | None:
    """The value a string stands for where the schema wants another type, or None when that is ambiguous.

    Only unambiguous conversions: "5" → 5 (integer/number), "2.5" → 2.5 (number), "true"/"false" → bool,
    JSON text of an object/array → that object/array. Nothing is ever invented.
    """
    types = view.types() or frozenset()
    stripped = text.strip()
    if "integer" in types and _INTEGER.fullmatch(stripped):
        return int(stripped)
    if "number" in types and _NUMBER.fullmatch(stripped):
        number = float(stripped)
        return int(number) if number.is_integer() and "e" not in stripped.lower() else number
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if types & {"object", "array"} and stripped[:1] in ("{", "["):
        try:
            decoded = cast(JsonValue, json.loads(stripped))
        except (json.JSONDecodeError, RecursionError):
            return None
        if ("object" in types and isinstance(decoded, dict)) or ("array" in types and isinstance(decoded, list)):
            return decoded
    return None


def coerce_number(literal: str, view: SchemaView | None) -> str:
    """A JSON number where the schema says integer only: `5.0` → `5` (exact values only)."""
    if view is None:
        return literal
    types = view.types()
    if types is None or "integer" not in types or "number" in types:
        return literal
    try:
        number = float(literal)
    except ValueError:
        return literal
    return str(int(number)) if number.is_integer() and abs(number) < 2**53 else literal


def validation_errors(arguments_text: str, parameters: SchemaDict) -> list[str]:
    """Why `arguments_text` does not satisfy the tool's schema (empty when it does)."""
    try:
        arguments = cast(JsonValue, json.loads(arguments_text))
    except json.JSONDecodeError as error:
        return [f"arguments are not valid JSON ({error.msg} at {error.pos})"]
    except RecursionError:
        return ["arguments nest deeper than can be parsed"]
    try:
        validator_class = validator_for(parameters)  # pyright: ignore[reportUnknownVariableType]
        validator = validator_class(parameters)  # pyright: ignore[reportUnknownVariableType]
        errors = [str(error.message) for error in validator.iter_errors(arguments)]  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType, reportUnknownArgumentType]
    except SchemaError as error:
        return [f"the tool's schema is invalid, arguments not checked: {error.message}"]
    except RecursionError:
        # Deep arguments under a recursive schema (or a long chain of $refs): the validator recurses per level.
        return ["arguments nest deeper than can be checked against the tool's schema"]
    return errors
