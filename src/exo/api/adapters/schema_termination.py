"""Schemas nothing can finish: pure checks on a JSON Schema, run at the API before any generation starts.

Two kinds of schema are valid JSON Schema yet cannot be served:

- one that applies itself to the same value without end (`{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref":
  "#/$defs/a"}`, or `{"anyOf": [{"$ref": "#"}]}`): no validator can evaluate it (jsonschema recurses until
  Python gives up), so it is refused wherever it appears;
- one that no finite value satisfies (`next` required and of the schema's own type, `enum: []`, a required property
  whose schema is `false`): harmless to validate, but a grammar enforcing it can never end, so it is refused where
  the schema is enforced by the grammar (a forced or strict tool call, `response_format`).

Only local references (`#`, `#/$defs/x`) are followed; anything else is left to the grammar compiler to judge.
"""

from collections.abc import Iterator, Mapping
from typing import Final, cast
from urllib.parse import unquote

Schema = object
_JsonMap = Mapping[str, object]

# Keywords holding subschemas: how (one schema, a list, or a map of them) and whether they apply to the very value
# their parent applies to (in place) or to a part of it.
_SINGLE, _LIST, _MAP = "single", "list", "map"
_SUBSCHEMA_KEYWORDS: Final[dict[str, tuple[str, bool]]] = {
    **dict.fromkeys(("not", "if", "then", "else"), (_SINGLE, True)),
    **dict.fromkeys(("allOf", "anyOf", "oneOf"), (_LIST, True)),
    **dict.fromkeys(("dependentSchemas", "dependencies"), (_MAP, True)),
    **dict.fromkeys(
        (
            "additionalProperties",
            "additionalItems",
            "contains",
            "propertyNames",
            "unevaluatedItems",
            "unevaluatedProperties",
        ),
        (_SINGLE, False),
    ),
    "items": (_SINGLE, False),  # or a list (the older tuple form): handled by shape below
    "prefixItems": (_LIST, False),
    **dict.fromkeys(("properties", "patternProperties", "$defs", "definitions"), (_MAP, False)),
}
# Deeper than this, a schema is not examined further (and is taken to be finishable): Python's recursion limit
# must stay out of reach of whatever a client sends.
_MAX_DEPTH: Final = 200
_SCALAR_TYPES: Final = frozenset({"null", "boolean", "number", "integer", "string"})
_ALL_TYPES: Final = frozenset({*_SCALAR_TYPES, "object", "array"})
# Keywords that make a value's type explicit; without any, a tool's parameters are taken as an object (as the
# grammar builder does).
_TYPE_DECIDING: Final = ("type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const")


# Schema nodes one request's checks examine at most (well under a second): past this its schemas are taken to be
# fine (the grammar compiler still judges them), so no request can make the checks themselves expensive.
REQUEST_BUDGET: Final = 50_000


class _TooComplexError(Exception):
    pass


class CheckBudget:
    """How many more schema nodes the checks of one request may examine; share one across a request's schemas."""

    def __init__(self, nodes: int = REQUEST_BUDGET) -> None:
        self._left = nodes

    def spend(self) -> None:
        self._left -= 1
        if self._left < 0:
            raise _TooComplexError


def _as_map(value: object) -> _JsonMap | None:
    # Parsed JSON: objects are dicts (a Mapping check costs several times more, on every node).
    return cast(_JsonMap, value) if isinstance(value, dict) else None


def _as_list(value: object) -> list[object]:
    return cast(list[object], value) if isinstance(value, list) else []


def _resolve(root: Schema, reference: str) -> tuple[str, Schema] | None:
    """The pointer and schema a local `$ref` names; None when it is not local or names nothing."""
    if not reference.startswith("#"):
        return None
    pointer = unquote(reference[1:])
    if pointer and not pointer.startswith("/"):
        return None  # an anchor (`#name`): left to the grammar compiler
    node: object = root
    for escaped in pointer.split("/")[1:] if pointer else []:
        token = escaped.replace("~1", "/").replace("~0", "~")
        mapping = _as_map(node)
        if mapping is not None and token in mapping:
            node = mapping[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(cast(list[object], node)):
            node = cast(list[object], node)[int(token)]
        else:
            return None
    return "#" + pointer, node


def _subschemas(schema: _JsonMap) -> Iterator[tuple[Schema, bool]]:
    """Each subschema of `schema`, with whether it applies to the same value (in place) or to a part of it."""
    for keyword, value in schema.items():
        kind = _SUBSCHEMA_KEYWORDS.get(keyword)
        if kind is None:
            continue
        in_place = kind[1]
        if isinstance(value, dict):
            if kind[0] == _SINGLE:
                yield value, in_place
            elif kind[0] == _MAP:
                yield from ((member, in_place) for member in cast(_JsonMap, value).values())
        elif isinstance(value, list):
            yield from ((member, in_place) for member in cast(list[object], value))


def _references(schema: Schema, budget: CheckBudget) -> list[tuple[str, bool]]:
    """The `$ref`s inside `schema` (not followed), each with whether it applies to the same value as `schema`."""
    found: list[tuple[str, bool]] = []
    pending: list[tuple[Schema, bool, int]] = [(schema, True, 0)]
    while pending:
        node, in_place, depth = pending.pop()
        budget.spend()
        mapping = _as_map(node)
        if mapping is None or depth > _MAX_DEPTH:
            continue
        reference = mapping.get("$ref")
        if isinstance(reference, str):
            found.append((reference, in_place))
        pending.extend((child, in_place and same, depth + 1) for child, same in _subschemas(mapping))
    return found


class _Target:
    """A schema some local `$ref` (or the root, `#`) names, and the targets it applies to the same value."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.in_place: list[str] = []
        self.referenced: list[str] = []


def _targets(root: Schema, budget: CheckBudget) -> dict[str, _Target]:
    """Every `$ref` target reachable from the root (and the root as `#`), each walked once."""
    targets: dict[str, _Target] = {}
    pending = ["#"]
    while pending:
        pointer = pending.pop()
        if pointer in targets:
            continue
        resolved = _resolve(root, pointer)
        target = targets[pointer] = _Target(resolved[1] if resolved else None)
        for reference, same_value in _references(target.schema, budget):
            if (named := _resolve(root, reference)) is not None:
                pending.append(named[0])
                target.referenced.append(named[0])
                if same_value:
                    target.in_place.append(named[0])
    return targets


def self_application_cycle(root: Schema, budget: CheckBudget) -> str | None:
    """Where `root` applies a schema to the same value without end (a cycle of `$ref`s through in-place keywords
    only), described for an error message; None when there is no such cycle (or `budget` ran out first)."""
    try:
        targets = _targets(root, budget)
    except _TooComplexError:
        return None
    finished: set[str] = set()
    for start, first in targets.items():
        if start in finished:
            continue
        trail, on_trail, iterators = [start], {start}, [iter(first.in_place)]
        while iterators:
            following = next(iterators[-1], None)
            if following is None:
                iterators.pop()
                on_trail.discard(trail[-1])
                finished.add(trail.pop())
            elif following in on_trail:
                cycle = " → ".join(f"'{step}'" for step in [*trail[trail.index(following) :], following])
                return f"it applies itself to the same value without end ({cycle}), so a validator can loop forever"
            elif following not in finished:
                trail.append(following)
                on_trail.add(following)
                iterators.append(iter(targets[following].in_place))
    return None


Failure = tuple[str, Schema]
"""Why no finite value satisfies a schema: a label for the step that fails, and what it leads to (a subschema, or
the pointer of a `$ref` target)."""


class _Finiteness:
    """Which schemas some finite value satisfies: a least fixed point over the local `$ref` targets of one root."""

    def __init__(self, root: Schema, budget: CheckBudget) -> None:
        self._root = root
        self._budget = budget
        targets = _targets(root, self._budget)
        self.finite: dict[str, bool] = dict.fromkeys(targets, False)
        referenced_by: dict[str, set[str]] = {pointer: set() for pointer in targets}
        for pointer, target in targets.items():
            for referenced in target.referenced:
                referenced_by[referenced].add(pointer)
        # A target can only become finite when one it refers to does: re-examine just those (each flips once).
        pending = list(targets)
        while pending:
            pointer = pending.pop()
            if not self.finite[pointer] and self.first_failure(targets[pointer].schema) is None:
                self.finite[pointer] = True
                pending.extend(referrer for referrer in referenced_by[pointer] if not self.finite[referrer])

    def first_failure(self, schema: Schema, depth: int = 0) -> Failure | None:
        """The step that keeps every finite value from satisfying `schema`, or None when some finite value does."""
        self._budget.spend()
        if schema is False:
            return "false", _FALSE
        mapping = _as_map(schema)
        if mapping is None or depth > _MAX_DEPTH:
            return None
        reference = mapping.get("$ref")
        target = _resolve(self._root, reference) if isinstance(reference, str) else None
        if target is not None and not self.finite.get(target[0], True):
            return f"$ref '{target[0]}'", _Pointer(target[0])
        for branch in _as_list(mapping.get("allOf")):
            if self.first_failure(branch, depth + 1) is not None:
                return "allOf", branch
        for keyword in ("anyOf", "oneOf"):
            branches = _as_list(mapping.get(keyword))
            if branches and all(self.first_failure(branch, depth + 1) is not None for branch in branches):
                return keyword, branches[0]
        if "const" in mapping:
            return None
        if "enum" in mapping:
            return ("enum []", _FALSE) if not _as_list(mapping["enum"]) else None
        return self._type_failure(mapping, depth)

    def _type_failure(self, mapping: _JsonMap, depth: int) -> Failure | None:
        declared = mapping.get("type")
        types = {declared} if isinstance(declared, str) else set(_as_list(declared)) or set(_ALL_TYPES)
        if types & _SCALAR_TYPES:
            return None
        object_failure = self._object_failure(mapping, depth) if "object" in types else None
        array_failure = self._array_failure(mapping, depth) if "array" in types else None
        if ("object" in types and object_failure is None) or ("array" in types and array_failure is None):
            return None
        return object_failure or array_failure

    def _object_failure(self, mapping: _JsonMap, depth: int) -> Failure | None:
        properties = _as_map(mapping.get("properties")) or {}
        for name in _as_list(mapping.get("required")):
            if isinstance(name, str):
                member = properties.get(name, mapping.get("additionalProperties", True))
                if self.first_failure(member, depth + 1) is not None:
                    return f"required '{name}'", member
        return None

    def _array_failure(self, mapping: _JsonMap, depth: int) -> Failure | None:
        minimum = mapping.get("minItems")
        if not isinstance(minimum, int) or minimum <= 0:
            return None
        items = mapping.get("items")
        prefix = _as_list(mapping.get("prefixItems")) or _as_list(items)
        rest = items if _as_map(items) is not None or items is False else True
        for index in range(min(minimum, len(prefix) + 1)):
            element = prefix[index] if index < len(prefix) else rest
            if self.first_failure(element, depth + 1) is not None:
                return f"item {index}", element
        return None


class _Pointer(str):
    """A `$ref` target's pointer, as what a failing step leads to."""


_FALSE: Final = _Pointer("false")


def as_tool_parameters(parameters: Schema) -> Schema:
    """A tool's parameters as the grammar enforces them: an object unless the schema decides the type itself."""
    mapping = _as_map(parameters)
    if mapping is None or any(keyword in mapping for keyword in _TYPE_DECIDING):
        return parameters
    return {**mapping, "type": "object"}


def unfinishable_reason(root: Schema, budget: CheckBudget) -> str | None:
    """Why no finite value satisfies `root` (the chain of requirements that never ends), or None when one does (or
    `budget` ran out first)."""
    try:
        finiteness = _Finiteness(root, budget)
        failure = finiteness.first_failure(root)
        steps: list[str] = []
        seen = {"#"}
        while failure is not None and len(steps) < 12:
            label, leads_to = failure
            steps.append(label)
            if isinstance(leads_to, _Pointer):
                if leads_to is _FALSE or leads_to in seen:
                    break
                seen.add(leads_to)
                target = _resolve(root, leads_to)
                failure = finiteness.first_failure(target[1]) if target is not None else None
            else:
                failure = finiteness.first_failure(leads_to)
    except _TooComplexError:
        return None
    if not steps:
        return None
    return f"no finite value satisfies it ({' → '.join(steps)}), so a grammar enforcing it could never end"
