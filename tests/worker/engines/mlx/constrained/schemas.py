"""Tool definitions with the schema shapes agents send (zod/pydantic output)."""

from typing import Final

from exo.shared.types.tool_spec import ToolSpec

WEATHER: Final = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)

SEARCH: Final = ToolSpec(
    name="search",
    strict=True,
    parameters={
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["news", "web", "code"]}, "maxItems": 3},
            "exact": {"type": "boolean"},
        },
        "required": ["query", "limit"],
        "additionalProperties": False,
    },
)

TODO_WRITE: Final = ToolSpec(
    name="todo_write",
    parameters={
        "type": "object",
        "properties": {
            "todos": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "status": {"type": "string", "enum": ["pending", "done"]},
                        "owner": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "email": {"type": ["string", "null"]}},
                            "required": ["name"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["id", "status", "owner"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["todos"],
        "additionalProperties": False,
    },
)

# Pydantic puts nested models under `$defs` and points at them with `$ref` from the schema root.
MOVE_FILE: Final = ToolSpec(
    name="move_file",
    parameters={
        "$defs": {
            "Location": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "line": {"type": "number"}},
                "required": ["path"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"source": {"$ref": "#/$defs/Location"}, "target": {"$ref": "#/$defs/Location"}},
        "required": ["source", "target"],
        "additionalProperties": False,
    },
)

# zod's shape for a tool without arguments.
LIST_FILES: Final = ToolSpec(
    name="list_files", parameters={"type": "object", "properties": {}, "additionalProperties": False}
)

ALL_TOOLS: Final = (WEATHER, SEARCH, TODO_WRITE, MOVE_FILE, LIST_FILES)
