"""How deep a client's JSON Schema may nest, checked before anything else reads it.

Every reader of a schema walks it by recursion: jsonschema's `check_schema` and argument validation, the
termination checks, the grammar builder. Past a depth that depends on the reader and on how deep the call stack
already is, Python gives up with a RecursionError (a 500, on main 0b66627, for a valid schema nested about 95 levels
deep). A schema is therefore measured here without recursion, and one nested deeper than MAX_SCHEMA_DEPTH levels of
JSON objects and arrays is refused with a 400 that names the limit. Real tool schemas nest a few levels; the limit
leaves every reader far from Python's.
"""

from typing import Final, cast

from exo.api.errors import ApiError

MAX_SCHEMA_DEPTH: Final = 64
"""Levels of JSON objects and arrays in one schema document (`{"type": "string"}` is one level)."""


def schema_depth_at_least(schema: object, limit: int) -> int:
    """How many levels of objects and arrays `schema` nests, counted up to `limit + 1` (the walk stops there)."""
    deepest = 0
    pending: list[tuple[object, int]] = [(schema, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            children: list[object] = list(cast(dict[str, object], value).values())
        elif isinstance(value, list):
            children = cast(list[object], value)
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        pending.extend((child, depth + 1) for child in children)
    return deepest


def check_schema_depth(schema: object, where: str) -> None:
    """Raise a 400 naming `where` and the limit when `schema` nests deeper than MAX_SCHEMA_DEPTH levels."""
    if schema_depth_at_least(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise ApiError(
            400,
            f"{where} nests JSON objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep; schemas are limited "
            f"to {MAX_SCHEMA_DEPTH} levels (move shared parts into $defs and refer to them with $ref)",
            param=where,
            code="schema_too_deep",
        )
