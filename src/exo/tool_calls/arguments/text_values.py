"""Convert an XML parameter's text (qwen3_coder) to the JSON value its schema asks for, never inventing one."""

import ast
import json

from exo.tool_calls.arguments.python_literals import json_compatible
from exo.tool_calls.arguments.schema import JsonValue, SchemaView, coerce_string


def streams_as_string(view: SchemaView | None) -> bool:
    """A parameter whose schema says exactly "string" can be streamed character by character."""
    return view is not None and view.types() == frozenset({"string"})


def convert_xml_value(text: str, view: SchemaView | None) -> JsonValue:
    """`"5"` → 5 for integer, `"5.0"` → 5 for integer only when exact, JSON or single-quoted (Python literal)
    objects for object/array, true/false for boolean, null where allowed; anything unclear stays a string."""
    types = view.types() if view is not None else None
    stripped = text.strip()
    if types is None:
        return _container(stripped) if stripped[:1] in ("{", "[") else text
    if "string" in types and len(types) == 1:
        return text
    if stripped.lower() in ("null", "none") and "null" in types:
        return None
    assert view is not None
    coerced = coerce_string(stripped, view)
    if coerced is not None:
        return coerced
    if "integer" in types:
        try:
            number = float(stripped)
        except ValueError:
            number = None
        if number is not None and number.is_integer():
            return int(number)
    if types & {"object", "array"}:
        container = _container(stripped)
        if ("object" in types and isinstance(container, dict)) or ("array" in types and isinstance(container, list)):
            return container
    return text


def _container(text: str) -> JsonValue:
    """JSON text, else a Python literal (models write single-quoted dicts); the text itself if neither."""
    try:
        return json_compatible(json.loads(text, strict=False))
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError)
        pass
    try:
        return json_compatible(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
