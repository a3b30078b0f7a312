"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, typed by HTTP status."""

from exo.api.errors import ApiError
from exo.api.types.anthropic_messages import AnthropicErrorBody, AnthropicErrorResponse, AnthropicErrorType

_TYPE_BY_STATUS: dict[int, AnthropicErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
# Claude Code (and other Anthropic clients) compact the conversation when an error says this.
_PROMPT_TOO_LONG = "prompt is too long"


def anthropic_error_body(status_code: int, message: str, code: str | None = None) -> AnthropicErrorBody:
    """The error body for a failure with `status_code`; a context overflow reads as Anthropic's own wording."""
    if code == "context_length_exceeded" and _PROMPT_TOO_LONG not in message.lower():
        message = f"{_PROMPT_TOO_LONG}: {message}"
    error_type = _TYPE_BY_STATUS.get(status_code, "invalid_request_error" if status_code < 500 else "api_error")
    return AnthropicErrorBody(type=error_type, message=message)


def anthropic_error(error: ApiError) -> AnthropicErrorResponse:
    """`error` (raised anywhere below the route) as Anthropic's error response body."""
    body = error.body.error
    return AnthropicErrorResponse(error=anthropic_error_body(error.status_code, body.message, body.code))
