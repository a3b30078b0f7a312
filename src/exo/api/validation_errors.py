"""Pydantic's validation problems → one OpenAI-style 400 that names the client's own field.

Pydantic locations carry parts that are not the client's: the union member it tried (`stop.str`,
`tool_choice.NamedToolChoice`, `tool_choice.literal['none','auto','required']`) and, for a tagged union, the tag
(`response_format.json_schema.json_schema.name`). The location is walked through the request body, keeping only
the parts that name something in it (and a missing field's name), so `param` is a path the client can follow.
"""

from collections.abc import Sequence
from typing import Any, Final, cast

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from exo.api.body_text import public_path
from exo.api.errors import ApiError, error_response

# Without a body to walk (a caller that has none), parts shaped like pydantic's member names are dropped: OpenAI
# field names are lower snake case.
_UNION_MEMBER_NAMES: Final = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_UNION_MEMBER_PREFIXES: Final = ("constrained-", "function-", "lax-or-strict", "literal[")


def _looks_like_a_member(part: str) -> bool:
    return part[:1].isupper() or "[" in part or part in _UNION_MEMBER_NAMES or part.startswith(_UNION_MEMBER_PREFIXES)


def _client_parts(problem: Any, body: object) -> list[int | str]:
    """The parts of the problem's location that name something the client sent (or a field it left out)."""
    location: Sequence[int | str] = problem.get("loc", ())
    parts = [part for part in location[1:] if isinstance(part, int) or not _looks_like_a_member(part)]
    if tuple(location[:1]) != ("body",) or not isinstance(body, dict | list):
        return parts
    kept: list[int | str] = []
    node = body
    for position, part in enumerate(parts):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = cast(dict[str, object], node)[part]
            kept.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(cast(list[object], node)):
            node = cast(list[object], node)[part]
            kept.append(part)
        elif position == len(parts) - 1 and problem.get("type") == "missing":
            kept.append(part)
    return kept


def _is_type_mismatch(problem: Any) -> bool:
    problem_type = str(problem.get("type", ""))
    return problem_type.endswith("_type") or problem_type in ("model_attributes_type", "union_tag_invalid")


def validation_error(problems: Sequence[Any], body: object = None) -> ApiError:
    """One 400 naming the most telling problem (or every unknown field); `body` is the request body as parsed."""
    unknown = [
        public_path(_client_parts(problem, body)) for problem in problems if problem.get("type") == "extra_forbidden"
    ]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        return ApiError(
            400,
            f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}",
            param=unknown[0],
            code="unknown_parameter",
        )
    # A union reports one problem per member it tried. The member that got furthest into the value says most, and
    # among equals a member's own complaint (too long, out of range) says more than "should be a valid string".
    first = max(
        problems,
        key=lambda problem: (len(_client_parts(problem, body)), not _is_type_mismatch(problem)),
        default={},
    )
    problem_type = first.get("type")
    # A syntax error's location is a character offset, not a field: the message says where.
    location = "" if problem_type == "json_invalid" else public_path(_client_parts(first, body))
    message = str(first.get("msg", "invalid request"))
    if problem_type == "json_invalid":
        offset = next((part for part in first.get("loc", ())[1:] if isinstance(part, int)), None)
        where = f" (at character {offset})" if offset is not None else ""
        message = f"request body is not valid JSON: {first.get('ctx', {}).get('error', message)}{where}"
    elif not location and problem_type == "missing":
        message = "the request body is empty; send a JSON object"
    elif not location and problem_type in ("model_attributes_type", "dict_type"):
        # FastAPI hands over raw bytes when the Content-Type is not JSON (curl -d sends a form type).
        message = "the request body must be a JSON object sent with Content-Type: application/json"
    elif location:
        message = f"{location}: {message}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    return ApiError(400, message, param=location or None, code="invalid_request")


async def handle_validation_error(_request: Request, error: Exception) -> JSONResponse:
    """The app-wide handler: a request that does not validate gets validation_error's 400 in OpenAI's shape."""
    assert isinstance(error, RequestValidationError)
    return error_response(validation_error(error.errors(), error.body))
