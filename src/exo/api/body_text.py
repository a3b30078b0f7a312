"""Refuse JSON bodies carrying values nothing behind the API can pass on: bytes that are not UTF-8, lone UTF-16
surrogates (`"\\ud800"` is a valid JSON escape but not Unicode: it cannot be encoded for the runner or a tokenizer),
NUL characters, and the non-standard constants `NaN` / `Infinity` that Python's JSON parser accepts.

It runs on the raw body in the request guard, before any route, so every JSON endpoint gets it without doing
anything. The common body costs one regular-expression scan: the body is parsed here only when that scan finds
something that may be one of these values, and then the answer names where it is (`messages[0].content`).
"""

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

# Escapes of surrogates (paired ones are fine, and are told apart after parsing) and escaped NUL, and the constants
# where a value starts. A hit is only a hint; most bodies have none. The escapes share a literal prefix and the
# constants are looked for as plain bytes first, so the common body is scanned at memory speed.
_MAYBE_INVALID_ESCAPE: Final = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")
_CONSTANT_VALUE: Final = re.compile(rb"[:\[,][ \t\r\n]*-?(?:NaN|Infinity)")
_INVALID_CHARACTER: Final = re.compile("[\ud800-\udfff\x00]")

BodyProblemCode = Literal["invalid_text", "invalid_value", "too_many_messages"]


@dataclass(frozen=True)
class BodyProblem:
    """Why a body is refused: a message for the client, the field it is in (None for the body itself), a code."""

    message: str
    param: str | None
    code: BodyProblemCode


class _NonFinite:
    def __init__(self, name: str) -> None:
        self.name = name


def find_body_problem(body: bytes) -> BodyProblem | None:
    """The first value in the JSON `body` that cannot be passed on, or None.

    A body that is not JSON at all is not this check's business: the endpoint refuses it in its own words.
    """
    if not body:
        return None
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as error:
            return BodyProblem(f"the request body is not valid UTF-8 (at byte {error.start})", None, "invalid_text")
    if _MAYBE_INVALID_ESCAPE.search(body) is None and not _may_hold_a_constant(body):
        return None
    try:
        document: object = json.loads(body, parse_constant=_NonFinite)
    except (ValueError, RecursionError):
        return None
    return _first_problem(document)


def _may_hold_a_constant(body: bytes) -> bool:
    """Whether `NaN` or `Infinity` appears where a JSON value starts (after `:`, `[` or `,`)."""
    return (b"NaN" in body or b"Infinity" in body) and _CONSTANT_VALUE.search(body) is not None


def public_path(parts: Sequence[int | str]) -> str:
    """`("messages", 0, "content")` → `messages[0].content`, the way error `param`s name fields."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _first_problem(document: object) -> BodyProblem | None:
    """Walk the document depth-first in order (iteratively: nesting depth is the client's choice)."""
    pending: list[tuple[tuple[int | str, ...], object]] = [((), document)]
    while pending:
        path, value = pending.pop()
        problem = _value_problem(value, path)
        if problem is not None:
            return problem
        if isinstance(value, dict):
            items: list[tuple[str, object]] = list(value.items())  # pyright: ignore[reportUnknownArgumentType]
            pending.extend(((*path, key), item) for key, item in reversed(items))
        elif isinstance(value, list):
            elements: list[object] = value  # pyright: ignore[reportUnknownVariableType]
            pending.extend(((*path, index), item) for index, item in reversed(list(enumerate(elements))))
    return None


def _value_problem(value: object, path: tuple[int | str, ...]) -> BodyProblem | None:
    """What is wrong with `value` itself (its keys, for an object), not with what it contains."""
    if isinstance(value, str):
        return _text_problem(value, path)
    if isinstance(value, _NonFinite):
        where = public_path(path)
        return BodyProblem(
            f"{where or 'the request body'}: {value.name} is not a JSON number", where or None, "invalid_value"
        )
    if isinstance(value, dict):
        keys: list[str] = list(value)  # pyright: ignore[reportUnknownArgumentType]
        return next((found for key in keys if (found := _text_problem(key, path, key=True)) is not None), None)
    return None


def _text_problem(text: str, path: tuple[int | str, ...], *, key: bool = False) -> BodyProblem | None:
    found = _INVALID_CHARACTER.search(text)
    if found is None:
        return None
    character = found.group()
    if character == "\x00":
        what = "a NUL character (\\u0000)"
    else:
        # A surrogate that survived parsing has no partner: a pair would have become one character.
        what = f"a lone UTF-16 surrogate (\\u{ord(character):04x}), which is not valid Unicode"
    where = public_path(path) or "the request body"
    subject = f"a key of {where}" if key else where
    return BodyProblem(
        f"{subject}: the text contains {what} at character {found.start()}; strings must be valid Unicode "
        "without NUL characters",
        public_path(path) or None,
        "invalid_text",
    )
