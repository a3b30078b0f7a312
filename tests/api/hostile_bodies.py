"""Hypothesis strategies for hostile request bodies, derived from a request model's own JSON schema.

The body follows the model's structure (every field, nested, union members, discriminated types) so that the
hostile values reach deep fields instead of failing at the top; at any node, one draw in `odds` replaces the value
by something an attacker would send: lone surrogates, NUL, huge and negative numbers, NaN, wrong types,
strings for booleans. Fields that carry a JSON Schema (tool parameters, response formats) get schemas that recurse
without end, cannot be satisfied or are malformed.

Token limits stay small (or invalid) so one valid request costs a real node a fraction of a second.
"""

from typing import Any, Final, cast

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from pydantic import BaseModel

Schema = dict[str, Any]

MAX_DEPTH: Final = 7

_HOSTILE_STRINGS: Final[list[object]] = [
    "\ud800",  # a lone surrogate: valid JSON escape, not valid Unicode
    "ok\udfffok",
    "\x00",
    "nul\x00inside",
    "x" * 3000,
    "",
    "\u202e\u200b",
    "🦙" * 50,
    "../../etc/passwd",
    "<tool_call>{",
    "{{ raise_exception('x') }}",
]
_HOSTILE_NUMBERS: Final[list[object]] = [
    -1,
    0,
    2**64 - 1,
    2**64,
    2**70,
    -(2**63),
    10**400,
    1e308,
    -1e308,
    1e-39,
    5e-324,
    -0.0,
    1.5,
    float("nan"),
    float("inf"),
]
_HOSTILE_OTHER: Final[list[object]] = [None, True, False, "yes", "1", [], {}, [None], {"": None}, [[[[]]]]]
HOSTILE_LEAVES: Final = st.sampled_from(_HOSTILE_STRINGS + _HOSTILE_NUMBERS + _HOSTILE_OTHER)


def _deep(levels: int) -> Schema:
    schema: Schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


HOSTILE_SCHEMAS: Final[list[object]] = [
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},  # applies itself forever
    {"allOf": [{"$ref": "#"}]},
    {
        "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
        "$ref": "#/$defs/n",
    },  # no finite value satisfies it
    {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    {"enum": []},
    {"type": "object", "properties": {"x": False}, "required": ["x"]},
    {"anyOf": []},
    {"type": "string", "pattern": "("},
    {"type": "nonsense"},
    {"type": "string", "minLength": 10**9},
    {"type": "array", "minItems": 2**70},
    {"type": "integer", "minimum": 10**400},
    {"$ref": "#/$defs/missing"},
    {"$ref": "file:///etc/passwd"},
    _deep(40),
    _deep(95),  # valid, and past MAX_SCHEMA_DEPTH: was a RecursionError 500 (main 0b66627)
    _deep(180),
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},  # a sound one
    {"type": "object"},
]

# Fields whose value is itself a JSON Schema (every protocol's name for them).
_SCHEMA_FIELDS: Final = frozenset({"parameters", "schema", "input_schema", "json_schema"})
_TOKEN_LIMITS: Final = frozenset({"max_tokens", "max_completion_tokens", "max_output_tokens"})
_PROMPT_FIELDS: Final = frozenset({"model", "messages", "input", *_TOKEN_LIMITS})
_JSON: Final[SearchStrategy[object]] = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


def hostile_bodies(
    model: type[BaseModel], model_id: str, odds: int, *, lean: bool = False
) -> SearchStrategy[dict[str, object]]:
    """Request bodies shaped like `model` (naming `model_id` unless made hostile) with a hostile value at one node
    in `odds` (0: none). A `lean` body has the fields that make a prompt and at most one other top-level field, so
    sound ones mostly reach the model instead of being refused for a feature the server does not offer."""
    root = model.model_json_schema()
    properties: dict[str, Schema] = root["properties"]
    required = set(root.get("required", ()))
    if lean:
        required |= _PROMPT_FIELDS & set(properties)
    builder = _Builder(root.get("$defs", {}), model_id, odds)
    fields = {name: builder.node(schema, name, 1) for name, schema in properties.items()}
    needed = {name: strategy for name, strategy in fields.items() if name in required}
    others = {name: strategy for name, strategy in fields.items() if name not in required}
    if not lean:
        return st.fixed_dictionaries(needed, optional=others)
    extra = st.one_of([st.just({}), *(st.fixed_dictionaries({name: value}) for name, value in others.items())])
    return st.tuples(st.fixed_dictionaries(needed), extra).map(lambda parts: {**parts[0], **parts[1]})


class _Builder:
    def __init__(self, definitions: dict[str, Schema], model_id: str, odds: int) -> None:
        self._definitions = definitions
        self._model_id = model_id
        self._odds = odds

    def node(self, schema: Schema, name: str | None, depth: int) -> SearchStrategy[object]:
        if depth > MAX_DEPTH + 3:  # only a recursive model gets here, through required fields
            return HOSTILE_LEAVES
        normal = self._normal(schema, name, depth)
        if not self._odds:
            return normal
        hostile = st.sampled_from(HOSTILE_SCHEMAS) if name in _SCHEMA_FIELDS else HOSTILE_LEAVES
        return st.integers(1, self._odds).flatmap(lambda roll: hostile if roll == 1 else normal)

    def _resolve(self, schema: Schema) -> Schema:
        while "$ref" in schema:
            schema = self._definitions[str(schema["$ref"]).rsplit("/", 1)[-1]]
        return schema

    def _normal(self, schema: Schema, name: str | None, depth: int) -> SearchStrategy[object]:
        schema = self._resolve(schema)
        if name == "model":
            return st.just(self._model_id)
        if name in _TOKEN_LIMITS:
            return st.integers(1, 8)
        if name in _SCHEMA_FIELDS and schema.get("type") == "object" and "properties" not in schema:
            return st.sampled_from(HOSTILE_SCHEMAS)
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(cast(list[object], schema["enum"]))
        options = cast(list[Schema], schema.get("anyOf") or schema.get("oneOf") or schema.get("allOf") or [])
        if options:
            return st.one_of([self._normal(option, name, depth) for option in options])
        return self._typed(schema, depth)

    def _typed(self, schema: Schema, depth: int) -> SearchStrategy[object]:
        match schema.get("type"):
            case "object":
                return self._object(schema, depth)
            case "array":
                items = cast(Schema, schema.get("items", {}))
                most = 0 if depth >= MAX_DEPTH else min(int(schema.get("maxItems", 3)), 3)
                least = min(int(schema.get("minItems", 0)), most)
                return st.lists(self.node(items, None, depth + 1), min_size=least, max_size=most)
            case "string":
                return st.text(max_size=min(int(schema.get("maxLength", 40)), 40))
            case "integer":
                return st.integers(int(schema.get("minimum", -5)), int(schema.get("maximum", 100)))
            case "number":
                low, high = float(schema.get("minimum", -5.0)), float(schema.get("maximum", 5.0))
                return st.floats(low, high, allow_nan=False)
            case "boolean":
                return st.booleans()
            case "null":
                return st.none()
            case _:
                return _JSON

    def _object(self, schema: Schema, depth: int) -> SearchStrategy[object]:
        properties = cast(dict[str, Schema], schema.get("properties", {}))
        if not properties:
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict) and extra and depth < MAX_DEPTH:
                values = self.node(cast(Schema, extra), None, depth + 1)
                return st.dictionaries(st.text(max_size=8), values, max_size=2)
            return st.dictionaries(st.text(max_size=6), _JSON, max_size=2)
        required = set(cast(list[str], schema.get("required", [])))
        wanted = {name: sub for name, sub in properties.items() if name in required or depth < MAX_DEPTH}
        fields = {name: self.node(sub, name, depth + 1) for name, sub in wanted.items()}
        optional = {name: strategy for name, strategy in fields.items() if name not in required}
        return st.fixed_dictionaries({name: s for name, s in fields.items() if name in required}, optional=optional)
