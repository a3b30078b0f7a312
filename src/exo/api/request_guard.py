"""ASGI middleware in front of every route: the API key, the request-body size limit, then the body's text.

It is plain ASGI rather than a Starlette `BaseHTTPMiddleware` because the size limit must hold while the body is
read: a chunked upload has no Content-Length to check up front, so the guard reads the body itself, stops at the
limit, and hands the app a replay of what it read. Reading the whole body here also lets one check cover every JSON
endpoint, present and future: text that cannot be passed on (see body_text.py) is refused before any route runs.
"""

from collections.abc import Callable, Mapping

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from exo.api.body_budget import LARGE_BODY_BYTES, BodyBudget
from exo.api.body_text import find_body_problem
from exo.api.cluster_keys import ClusterKeys
from exo.api.error_shapes import ErrorShape, shaped_response
from exo.api.errors import ApiError, error_response
from exo.api.message_count import DEFAULT_MAX_MESSAGES, find_too_many_messages

UNAUTHENTICATED_PATHS = frozenset({"/health"})


def _header(scope: Scope, name: bytes) -> bytes | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    return next((value for key, value in headers if key.lower() == name), None)


def _bearer_token(authorization: bytes) -> bytes:
    """The credentials of `Authorization: Bearer TOKEN`; the scheme is case-insensitive (RFC 7235), the one space
    after it is not optional, and anything else yields no token."""
    scheme, separator, token = authorization.partition(b" ")
    return token if separator and scheme.lower() == b"bearer" else b""


def _credentials(scope: Scope) -> tuple[bytes, bytes]:
    # OpenAI clients send `Authorization: Bearer KEY`, Anthropic clients `x-api-key: KEY`.
    return _bearer_token(_header(scope, b"authorization") or b""), _header(scope, b"x-api-key") or b""


def _is_json(scope: Scope) -> bool:
    """Whether the body is meant as JSON: a JSON media type, or none at all (FastAPI reads that as JSON too)."""
    content_type = (_header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
    return not content_type or content_type == b"application/json" or content_type.endswith(b"+json")


OLLAMA_PATH_PREFIX = "/api/"
"""Ollama reads every body as JSON whatever its Content-Type (its documented `curl -d '{...}'` sends a form type)."""


def _as_json(scope: Scope) -> Scope:
    """The scope with its Content-Type set to JSON, as Ollama treats every body."""
    headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes", code="body_too_large")


class RequestGuard:
    """Reject unauthenticated requests (401: the cluster has a key, see cluster_keys.py) and bodies over
    `max_body_bytes` (413) before the app sees them."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: ClusterKeys,
        max_body_bytes: int,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        error_shapes: Mapping[str, ErrorShape] | None = None,
        open_paths: Callable[[str], bool] = lambda _path: False,
    ) -> None:
        self._app = app
        self._keys = keys
        self._max_body_bytes = max_body_bytes
        self._budget = BodyBudget(max_body_bytes)
        self._max_messages = max_messages
        # Path prefix → the error shape of the protocol served there (OpenAI's everywhere else).
        self._error_shapes = dict(error_shapes or {})
        # Paths served without the key besides /health (the dashboard's page and assets, which hold no data).
        self._open_paths = open_paths

    def _refusal(self, scope: Scope, error: ApiError) -> Response:
        path: str = scope["path"]
        shape = next((shape for prefix, shape in self._error_shapes.items() if path.startswith(prefix)), None)
        return error_response(error) if shape is None else shaped_response(shape, error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(OLLAMA_PATH_PREFIX):
            scope = _as_json(scope)
        is_open = path in UNAUTHENTICATED_PATHS or self._open_paths(path)
        if not is_open and self._keys.required() and not await self._keys.accepts(_credentials(scope)):
            unauthorized = ApiError(
                401,
                "missing or invalid API key",
                error_type="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await self._refusal(scope, unauthorized)(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body_bytes:
            await self._refusal(scope, _too_large(self._max_body_bytes))(scope, receive, send)
            return
        claim = _BudgetClaim(self._budget)
        try:
            if declared is not None and declared.isdigit() and int(declared) > LARGE_BODY_BYTES:
                await claim.take(int(declared))
            await self._guarded(scope, receive, claim.releasing(send), claim)
        finally:
            await claim.release()
            if claim.was_large:
                await self._budget.settle()

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, claim: "_BudgetClaim") -> None:
        body = await self._read_body(receive, claim)
        if body is None:
            await self._refusal(scope, _too_large(self._max_body_bytes))(scope, receive, send)
            return
        problem = (
            (find_body_problem(body) or find_too_many_messages(body, self._max_messages)) if _is_json(scope) else None
        )
        if problem is not None:
            refused = ApiError(400, problem.message, param=problem.param, code=problem.code)
            await self._refusal(scope, refused)(scope, receive, send)
            return
        replay = _replay(body, receive)
        del body  # the replay holds the only reference, and drops it once the app has read it
        await self._app(scope, replay, send)

    async def _read_body(self, receive: Receive, claim: "_BudgetClaim") -> bytes | None:
        """The whole body, or None as soon as it exceeds the limit (the rest is never read). A body without a
        declared length that grows past LARGE_BODY_BYTES claims the whole limit of the budget: its size is unknown."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client left before finishing its body; the app sees an empty body and the disconnect.
                return b"".join(parts)
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body_bytes:
                return None
            if size > LARGE_BODY_BYTES and not claim.taken:
                await claim.take(self._max_body_bytes)
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


class _BudgetClaim:
    """One request's share of the budget: taken before its large body is read, given back once its answer starts
    or the request ends, whichever comes first."""

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self._size = 0
        self.was_large = False

    @property
    def taken(self) -> bool:
        return self._size > 0

    async def take(self, size: int) -> None:
        self._size = await self._budget.take(size)
        self.was_large = True

    async def release(self) -> None:
        size, self._size = self._size, 0
        if size:
            await self._budget.give_back(size)

    def releasing(self, send: Send) -> Send:
        async def sending(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                await self.release()

        return sending


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields the buffered body once, then defers to the server (for disconnect notices). It lets go
    of the body once delivered, so a long stream does not keep a large body alive."""
    held: list[bytes] = [body]

    async def replayed() -> Message:
        if not held:
            return await receive()
        return {"type": "http.request", "body": held.pop(), "more_body": False}

    return replayed
