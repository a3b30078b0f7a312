"""A typed HTTP client of one exo node's API: what the MCP tools know about the cluster, they ask through this.

Every answer is parsed into the API's own response models, so a tool never reads a loose dict, and every failure is
one of two exceptions whose message a person (or a model) can act on: the node is not reachable, or it answered
with an error.
"""

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from exo.mcp.chat_wire import ChatAnswer, ChatRequest
from exo.models.catalog_api import (
    DownloadDone,
    DownloadEvent,
    DownloadFailed,
    DownloadProgress,
    DownloadRequest,
    NodeCatalog,
)
from exo.shared.types.api import ErrorResponse, ModelList
from exo.shared.types.cluster_api import (
    ClusterMetrics,
    ClusterNode,
    ClusterNodeList,
    ClusterSummary,
    DiscoveryReport,
    InstanceRequest,
    PeerConnection,
    PeerRequest,
    PlacedInstanceView,
)
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.state import State

DEFAULT_NODE_URL = "http://127.0.0.1:52415"
# Reads may wait for a whole completion on a slow CPU; connecting to a live node never takes long.
_TIMEOUT = httpx.Timeout(600.0, connect=5.0)

ResponseModel = TypeVar("ResponseModel", bound=BaseModel)
ProgressHandler = Callable[[ModelPreparation], Awaitable[None]]
_DOWNLOAD_EVENT: TypeAdapter[DownloadEvent] = TypeAdapter(DownloadEvent)


class NodeUnreachableError(Exception):
    """Nothing answered at the node's address (exo is not running there, or a network is in the way)."""


class NodeApiError(Exception):
    """The node answered with an error status; the message is the node's own (OpenAI-shaped) error message."""

    def __init__(self, status_code: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code


class NodeClient:
    """The API of the exo node at `base_url`, with its API key when it has one. Use it as an async context."""

    def __init__(
        self,
        base_url: str = DEFAULT_NODE_URL,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`transport` replaces the network (httpx's own seam; tests answer with a scripted node)."""
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=_TIMEOUT, transport=transport)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def health(self) -> None:
        """Return when the API answers `/health`; NodeUnreachableError when nothing does."""
        await self._request("GET", "/health")

    async def state(self) -> State:
        """The node's `/state`: nodes, runners (status, shard, last error) and in-flight tasks."""
        return await self._get("/state", State)

    async def models(self) -> ModelList:
        """The served models, as `/v1/models` lists them."""
        return await self._get("/v1/models", ModelList)

    async def chat_completion(self, request: ChatRequest) -> ChatAnswer:
        """One non-streaming chat completion."""
        body = request.model_dump(mode="json", exclude_none=True)
        response = await self._request("POST", "/v1/chat/completions", json=body)
        return _parsed(response, ChatAnswer)

    async def cluster(self) -> ClusterSummary:
        """The cluster at a glance: the answering node, nodes up and down, memory, models and where they run."""
        return await self._get("/v1/cluster", ClusterSummary)

    async def cluster_nodes(self) -> ClusterNodeList:
        """Every node the cluster has seen, with its facts and health."""
        return await self._get("/v1/cluster/nodes", ClusterNodeList)

    async def cluster_node(self, node_id: str) -> ClusterNode:
        """One node; NodeApiError 404 when the cluster has no such node."""
        return await self._get(f"/v1/cluster/nodes/{quote(node_id, safe='')}", ClusterNode)

    async def cluster_metrics(self) -> ClusterMetrics:
        """Per node and per model: requests, tokens, timings, queue depth, memory."""
        return await self._get("/v1/cluster/metrics", ClusterMetrics)

    async def add_peer(self, endpoint: str) -> PeerConnection:
        """Connect the node to another node's cluster endpoint."""
        body = PeerRequest(endpoint=endpoint).model_dump()
        return _parsed(await self._request("POST", "/v1/cluster/peers", body), PeerConnection)

    async def discover(self) -> DiscoveryReport:
        """Have the node scan for other nodes once."""
        return _parsed(await self._request("POST", "/v1/cluster/discover"), DiscoveryReport)

    async def place_instance(self, request: InstanceRequest) -> PlacedInstanceView:
        """Place a model over at least `request.min_nodes` nodes, split as `request.parallel` says."""
        body = request.model_dump(mode="json")
        return _parsed(await self._request("POST", "/v1/cluster/instances", body), PlacedInstanceView)

    async def catalog(self) -> NodeCatalog:
        """The models the node can fetch, which it has downloaded, and the memory each needs there."""
        return await self._get("/v1/catalog", NodeCatalog)

    async def download(self, model: str, on_progress: ProgressHandler) -> DownloadDone:
        """Have the node fetch and import a catalog model; `on_progress` gets each snapshot until it is done."""
        body = DownloadRequest(model=model).model_dump()
        async with self._streamed("POST", "/v1/catalog/download", body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                match _download_event(line.removeprefix("data: ")):
                    case DownloadProgress(preparation=preparation):
                        await on_progress(preparation)
                    case DownloadDone() as done:
                        return done
                    case DownloadFailed(error=error):
                        raise NodeApiError(500, error.message, error.code)
        raise NodeApiError(500, f"exo at {self.base_url} ended the download of {model} without a result")

    async def _get(self, path: str, model: type[ResponseModel]) -> ResponseModel:
        return _parsed(await self._request("GET", path), model)

    async def _request(self, method: str, path: str, json: object = None) -> httpx.Response:
        async with self._streamed(method, path, json) as response:
            await response.aread()
            return response

    @asynccontextmanager
    async def _streamed(self, method: str, path: str, json: object = None) -> AsyncGenerator[httpx.Response]:
        """The response to one request, body not yet read; an HTTP error status raises NodeApiError."""
        try:
            async with self._http.stream(method, path, json=json) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _api_error(self.base_url, path, response)
                yield response
        except httpx.TimeoutException as error:
            raise NodeUnreachableError(f"exo at {self.base_url} did not answer {path} in time ({error!r})") from error
        except httpx.TransportError as error:
            raise NodeUnreachableError(
                f"exo is not reachable at {self.base_url} ({_reason(error)}); is it running? Start it with `uv run exo`"
            ) from error


def _download_event(data: str) -> DownloadEvent:
    try:
        return _DOWNLOAD_EVENT.validate_json(data)
    except ValidationError as error:
        raise NodeApiError(500, f"the download answered an event this client does not know: {data[:300]}") from error


def _reason(error: httpx.TransportError) -> str:
    if isinstance(error, httpx.ConnectError):
        return "nothing accepted the connection"
    return str(error) or type(error).__name__


def _api_error(base_url: str, path: str, response: httpx.Response) -> NodeApiError:
    if response.status_code == 401:
        return NodeApiError(
            401, f"exo at {base_url} refused the API key; pass --api-key or set EXO_API_KEY", "invalid_api_key"
        )
    try:
        body = ErrorResponse.model_validate_json(response.content).error
    except ValidationError:
        return NodeApiError(response.status_code, f"{path} answered {response.status_code}: {response.text[:300]}")
    return NodeApiError(response.status_code, body.message, body.code)


def _parsed(response: httpx.Response, model: type[ResponseModel]) -> ResponseModel:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as error:
        # A node of another version may answer in a shape this client does not know.
        raise NodeApiError(
            response.status_code, f"{response.request.url.path} answered in an unexpected shape: {error}"
        ) from error
