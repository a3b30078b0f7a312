"""Grammar pieces for formats that write each argument on its own (XML tags, `key=value`, `key:value`).

The tool's schema is read at its top level: its `properties` become the parameters, in schema order, required
ones mandatory and the rest optional. A value whose schema is exactly a string is raw text in these formats (an
enum becomes its alternatives); any other value is JSON text checked against its own schema, which is what the
parser turns it back into. A schema without properties takes any parameter name with any text.

Under `strict`, a keyword such a layout cannot hold (a string `pattern`, `minProperties`…) is refused rather than
silently unenforced; otherwise it is skipped, as llguidance's lenient JSON mode skips what it cannot enforce.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from pydantic import JsonValue

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.grammar.lark import JsonObject, LarkWriter, literal
from exo.tool_calls.grammar.spec import UnsupportedConstraintError

_OBJECT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "description", "title", "$defs", "definitions"}
    | {"$schema", "$id", "$comment", "examples", "default"}
)
_TEXT_KEYWORDS = frozenset({"pattern", "format", "minLength", "maxLength"})
_DEFINITION_KEYS = ("$defs", "definitions")
PARAMETER_NAME = r"/[A-Za-z_][A-Za-z0-9_.\-]*/"


@dataclass(frozen=True)
class Parameter:
    name: str
    schema: JsonObject
    """The property's schema, carrying the root's `$defs` so its `$ref`s resolve on their own."""
    required: bool
    strict: bool

    @property
    def is_text(self) -> bool:
        """Written as raw text (its schema allows a string), not as JSON."""
        types = SchemaView(self.schema, self.schema).types()
        return types is not None and "string" in types


def tool_parameters(tool: ToolSpec, format_label: str) -> list[Parameter] | None:
    """The tool's parameters in schema order, or None when the schema names none (any name goes)."""
    root = tool.parameters
    strict = bool(tool.strict)
    if strict and (extra := sorted(set(root) - _OBJECT_KEYWORDS)):
        raise UnsupportedConstraintError(
            f"tool {tool.name!r}: the {format_label} format writes arguments one by one and cannot enforce "
            f"{', '.join(extra)} at the schema's top level under strict"
        )
    properties = root.get("properties")
    if not isinstance(properties, dict):
        return None
    required = root.get("required")
    required_names = (
        {name for name in cast(list[object], required) if isinstance(name, str)}
        if isinstance(required, list)
        else set[str]()
    )
    definitions = {key: root[key] for key in _DEFINITION_KEYS if key in root}
    parameters: list[Parameter] = []
    for name, schema in properties.items():
        member: JsonObject = {**cast(JsonObject, schema), **definitions} if isinstance(schema, dict) else {}
        parameters.append(Parameter(name=name, schema=member, required=name in required_names, strict=strict))
    return parameters


def text_value(lark: LarkWriter, parameter: Parameter, end: str, format_label: str) -> str:
    """A raw-text value ended by `end`: its enum's alternatives, or free text."""
    alternatives = _string_choices(parameter.schema)
    if alternatives is not None:
        return f"({' | '.join(literal(choice) for choice in alternatives)}) {lark.marker(end)}"
    if parameter.strict and (keywords := sorted(_TEXT_KEYWORDS & set(parameter.schema))):
        raise UnsupportedConstraintError(
            f"parameter {parameter.name!r}: the {format_label} format writes strings as raw text and cannot "
            f"enforce {', '.join(keywords)} under strict"
        )
    return lark.text_until(end, f"value_{parameter.name}")


def json_value(lark: LarkWriter, parameter: Parameter) -> str:
    """A JSON-text value checked against the parameter's schema."""
    return lark.json_value(parameter.schema, every_keyword_enforced=parameter.strict)


def _string_choices(schema: Mapping[str, JsonValue]) -> list[str] | None:
    values = schema.get("enum") if "enum" in schema else [schema["const"]] if "const" in schema else None
    if not isinstance(values, list) or not values or not all(isinstance(value, str) for value in values):
        return None
    return [value for value in values if isinstance(value, str)]


def parameter_sequence(
    lark: LarkWriter,
    parameters: Sequence[Parameter],
    item: Callable[[Parameter], str],
    separator: str = "",
) -> str:
    """The parameters in order, required ones mandatory, separated by `separator` (lark text, "" for none)."""
    tail = ""  # what may follow once something was written
    head = ""  # what may be written when nothing was yet
    for parameter in reversed(parameters):
        written = item(parameter)
        joined = f"{separator} {written}" if separator else written
        if parameter.required:
            new_tail, new_head = f"{joined} {tail}".strip(), f"{written} {tail}".strip()
        else:
            new_tail = f"({joined})? {tail}".strip()
            new_head = f"{written} {tail}".strip() + (f" | {head}" if head else "")
            new_head = f"({new_head})" + ("" if head else "?")
        tail = lark.rule(f"after_{parameter.name}", new_tail)
        head = lark.rule(f"from_{parameter.name}", new_head)
    return head or '""'


def any_parameters(lark: LarkWriter, item: Callable[[str], str], separator: str = "") -> str:
    """Any number of parameters with any names (a schema without `properties`); `item` gets the name expression."""
    one = item(PARAMETER_NAME)
    more = lark.rule("more_parameters", f"{separator} {one}" if separator else one)
    return f"({one} {more}*)?"
