"""The agent-loop guard: a call the model repeats although nothing it could learn from it has changed.

The server sees the whole conversation on every request, so it can tell when a model is caught in a loop (small
models re-issue one write dozens of times) from when it repeats a call for a reason. `CallHistory` reads the
conversation since the user last spoke and says, for a call the reply makes, how many identical calls in a row came
before it and whether it is a *real loop*: the third identical call in a row, after two results that were the same
and neither an error. Everything else goes through under every policy:

- a second identical call (polling a status twice; retrying once);
- a repeat after other calls in between (poll, sleep, poll; run the tests, edit, run them again);
- a repeat whose last result differed from the one before (a poll that progresses);
- a repeat after an error result (`error_result`: a retry);
- a repeat the user asked for (any user message after the calls, except one holding only Claude Code's
  `<system-reminder>` blocks, which it sends beside tool results).

`warn` reports a call from the second identical one in a row; `block` and `answer` withdraw a real loop (the
generator holds the call while it is written and takes it back). `excluding` writes the schema that forbids a
call's exact arguments: the repair of a failed call (constrained/repair.py) re-decodes under it.
"""

import json
import re
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
        except (ValueError, RecursionError):  # not JSON, or nested past what the parser recurses
            return arguments
    if not isinstance(value, dict):
        return arguments if isinstance(arguments, str) else json.dumps(value, sort_keys=True)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class TurnCall(FrozenModel):
    """A call of one assistant turn and what it got back."""

    key: CallKey
    result: str | None = None
    """The text of its result (the `tool` messages with its id, joined); None when the history has none."""
    error: bool = False
    """Whether that result reads as an error (`error_result`)."""


class CallHistory(FrozenModel):
    """What the guard reads from a conversation: the call turns since the user last spoke."""

    turns: tuple[tuple[TurnCall, ...], ...] = ()
    """The calls of each assistant turn since the user last spoke, oldest first (an assistant turn without calls
    is an empty turn: it breaks a row)."""

    @classmethod
    def of(cls, messages: Iterable[PromptMessage]) -> "CallHistory":
        listed = list(messages)
        results: dict[str, list[str]] = {}
        for message in listed:
            if message.role == "tool" and message.tool_call_id:
                results.setdefault(message.tool_call_id, []).append(message.content)
        turns: list[tuple[TurnCall, ...]] = []
        for message in listed:
            if message.role == "user" and _user_spoke(message.content):
                turns = []
            if message.role != "assistant":
                continue
            turn: list[TurnCall] = []
            for call in message.tool_calls:
                texts = results.get(call.call_id)
                result = "".join(texts) if texts is not None else None
                error = result is not None and error_result(result)
                turn.append(TurnCall(key=CallKey.of(call.name, call.arguments), result=result, error=error))
            turns.append(tuple(turn))
        return cls(turns=tuple(turns))

    def in_a_row(self, call: CallKey) -> int:
        """How many of the latest turns, in a row, made `call` (0: the latest turn did not)."""
        count = 0
        for turn in reversed(self.turns):
            if not any(made.key == call for made in turn):
                break
            count += 1
        return count

    def real_loop(self, call: CallKey) -> bool:
        """Whether `call` made now would be a real loop: the third identical call in a row, after two results that
        are the same (whitespace around them aside) and neither an error."""
        if self.in_a_row(call) < 2:
            return False
        last_two = [next(made for made in turn if made.key == call) for turn in self.turns[-2:]]
        answers = [made.result.strip() for made in last_two if made.result is not None and not made.error]
        return len(answers) == 2 and answers[0] == answers[1]

    def looping_calls(self) -> tuple[CallKey, ...]:
        """The calls that would be a real loop if the reply made them again (those of the latest turn)."""
        looping: list[CallKey] = []
        for made in self.turns[-1] if self.turns else ():
            if made.key not in looping and self.real_loop(made.key):
                looping.append(made.key)
        return tuple(sorted(looping, key=lambda key: (key.name, key.arguments)))

    def findings(self, calls: Sequence[CallKey]) -> tuple[str, ...]:
        """What `warn` reports about a reply that made `calls`: each call from the second identical one in a row."""
        found: list[str] = []
        for call in calls:
            before = self.in_a_row(call)
            if before:
                after = ", after identical results" if self.real_loop(call) else ""
                found.append(
                    f"repeated call {call.describe()}: identical call {before + 1} in a row since the user last "
                    f"spoke{after}"
                )
        return tuple(found)

    def repeated(self, calls: Sequence[CallKey]) -> int:
        """How many of `calls` repeat a call of the latest turn (what `warn` reports and /metrics counts)."""
        return sum(self.in_a_row(call) > 0 for call in calls)


_REMINDERS_ONLY: Final = re.compile(r"\s*(?:<system-reminder>.*?</system-reminder>\s*)+", re.DOTALL)
_ERROR_OPENING: Final = re.compile(
    r"^[\s*_#>\[(!-]*(?:error|exception|traceback|fatal|failed|failure)\b", re.IGNORECASE
)
_EXIT_CODE_OPENING: Final = re.compile(r"^\s*(?:exit code|process exited with code)\W*(-?\d+)", re.IGNORECASE)
_ERROR_FLAGS: Final = (("is_error", True), ("success", False), ("ok", False))
_EXIT_CODE_KEYS: Final = ("exit_code", "exitCode", "returncode")


def _user_spoke(content: str) -> bool:
    """Whether a user message is the user speaking: some text, and not only `<system-reminder>` blocks."""
    return bool(content.strip()) and _REMINDERS_ONLY.fullmatch(content) is None


def error_result(text: str) -> bool:
    """Whether a tool result reads as an error. The dialects have no common flag (only Messages has `is_error`,
    which its adapter writes into the result as "Error: …"), so the text is read:

    - it opens with error, exception, traceback, fatal, failed or failure (any case, after markup such as `**`,
      `#` or `[`);
    - it opens with a non-zero "Exit code: N" or "Process exited with code N" (Codex's shell output);
    - it is a JSON object with a truthy `error`, `"is_error": true`, `"success": false`, `"ok": false`, or a non-zero
      `exit_code` / `exitCode` / `returncode` at its top level or in its `metadata`.

    Reading too much as an error only makes the guard withdraw less."""
    if _ERROR_OPENING.match(text):
        return True
    exit_code = _EXIT_CODE_OPENING.match(text)
    if exit_code is not None:
        return int(exit_code.group(1)) != 0
    try:
        value: object = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and _error_object(cast(dict[str, object], value))


def _error_object(value: Mapping[str, object]) -> bool:
    if value.get("error") or any(key in value and value[key] is flag for key, flag in _ERROR_FLAGS):
        return True
    metadata = value.get("metadata")
    places = [value, cast(dict[str, object], metadata)] if isinstance(metadata, dict) else [value]
    codes = [place.get(key) for place in places for key in _EXIT_CODE_KEYS]
    return any(isinstance(code, int) and not isinstance(code, bool) and code != 0 for code in codes)


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


def withdrawal_finding(call: CallKey, then: str) -> str:
    """What `block` and `answer` report about a call they took back (`then`: what the reply did instead)."""
    return (
        f"repeated call {call.describe()} withdrawn: the third identical call in a row after two identical results, "
        f"so {then}"
    )


def kept_loop_finding(call: CallKey, why: str) -> str:
    """What `block` and `answer` report about a real loop they could not take back (`why`)."""
    return f"repeated call {call.describe()} not withdrawn although it loops: {why}"
