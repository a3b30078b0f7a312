"""Typed views of decoded JSON, so the checker can walk a payload without trusting its shape."""

import json
from collections.abc import Mapping, Sequence
from typing import cast

JsonMapping = Mapping[str, object]


def as_object(value: object) -> JsonMapping | None:
    """`value` as a JSON object, or None when it is anything else."""
    if isinstance(value, dict):
        return cast(JsonMapping, value)
    return None


def as_list(value: object) -> Sequence[object] | None:
    """`value` as a JSON array, or None when it is anything else."""
    if isinstance(value, list):
        return cast(Sequence[object], value)
    return None


def as_int(value: object) -> int | None:
    """`value` as a JSON integer, or None (booleans are ints to Python, not to JSON)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def parses_as_json(text: str) -> bool:
    """Whether `text` is one complete JSON value: what the AI SDK tests before it finalises a call."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def parses_as_json_object(text: str) -> bool:
    """Whether `text` is a complete JSON object (tool-call arguments must be one)."""
    try:
        value: object = json.loads(text)
    except json.JSONDecodeError:
        return False
    return as_object(value) is not None
