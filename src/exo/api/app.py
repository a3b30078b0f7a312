"""The OpenAI-compatible HTTP API. Thin: validate the request, hand a command to the master, shape the answer.

Every node serves it; a request for a model whose runner lives on another node is forwarded there by the master
and streamed back unchanged. The cluster's own endpoints (/v1/cluster…, /metrics) are in cluster_routes.py.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.api.adapters.messages_errors import anthropic_error
from exo.api.cluster_keys import ClusterKeys, cluster_verifiers, without_key_verifiers
from exo.api.cluster_routes import cluster_router
from exo.api.error_shapes import documented_errors
from exo.api.errors import (
    ApiError,
    handle_api_error,
    handle_http_error,
    handle_unexpected_error,
)
from exo.api.mcp_mount import mount_mcp
from exo.api.message_count import DEFAULT_MAX_MESSAGES
from exo.api.model_cards import model_cards
from exo.api.ollama.routes import OLLAMA_PATH_PREFIX, ollama_error, ollama_router
from exo.api.public_paths import PublicMasterClient, directory_hider, storage_directories
from exo.api.request_guard import RequestGuard
from exo.api.routes.catalog import catalog_router
from exo.api.routes.chat import chat_router
from exo.api.routes.messages import MESSAGES_PATH_PREFIX, messages_router
from exo.api.routes.responses import responses_router
from exo.api.validation_errors import handle_validation_error
from exo.dashboard.routes import is_dashboard_asset, mount_dashboard
from exo.master.client import MasterClient
from exo.models.paths import default_models_dir, exo_home
from exo.models.progress import PreparationSink
from exo.shared.freed_memory import map_large_allocations
from exo.shared.local_backend import local_weights_in_memory
from exo.shared.types.api import ErrorResponse, ModelList
from exo.shared.types.footprint import WeightsInMemory
from exo.shared.types.state import State

# Documented in the OpenAPI schema so clients and fuzzers know every failure has OpenAI's error shape.
_ERRORS = documented_errors(ErrorResponse)
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {status: _ERRORS[status] for status in (401, 500)}


@dataclass(frozen=True)
class ApiSettings:
    api_key: str | None = None
    max_request_bytes: int = 32 * 1024 * 1024
    # Where the API listens: the /mcp tools call the node's own API there.
    host: str = "127.0.0.1"
    port: int = 52415
    # This node's models directory, which the catalog routes download into (None: $EXO_HOME/models).
    models_dir: Path | None = None
    # Show where models live on disk in answers (/state, errors); otherwise only the logs do (public_paths.py).
    show_model_paths: bool = False
    # Most `messages` / `input` items one request may hold (message_count.py).
    max_request_messages: int = DEFAULT_MAX_MESSAGES
    # How this node's runners hold weights (`--cpu-kernels`, `--cpu-weights`): what the catalog's memory is for.
    weights_in_memory: WeightsInMemory = field(default_factory=local_weights_in_memory)


def create_app(
    master: MasterClient, settings: ApiSettings, record_preparation: PreparationSink | None = None
) -> FastAPI:
    """The FastAPI app in front of `master`: /health, /state, /v1/models, chat completions, Messages, Responses,
    Ollama's API (/api/…), the cluster's endpoints, this node's model catalog, the MCP tools at /mcp and the web
    dashboard at /.

    `record_preparation` puts the progress of a catalog download into this node's state (it is called from the
    download's thread); without it, downloads show their progress only to the client that asked.
    """
    models_dir = settings.models_dir or default_models_dir()
    cluster_state = master
    keys = ClusterKeys(settings.api_key, lambda: cluster_verifiers(cluster_state.state))
    hide_paths: Callable[[str], str] = str
    if not settings.show_model_paths:
        directories = storage_directories(models_dir, exo_home())
        master = PublicMasterClient(master, directories)
        hide_paths = directory_hider(directories)
    map_large_allocations()
    app = FastAPI(title="exo", version="0.1.0")
    app.add_exception_handler(ApiError, handle_api_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected_error)
    app.add_middleware(
        RequestGuard,
        keys=keys,
        max_body_bytes=settings.max_request_bytes,
        max_messages=settings.max_request_messages,
        error_shapes={MESSAGES_PATH_PREFIX: anthropic_error, OLLAMA_PATH_PREFIX: ollama_error},
        open_paths=is_dashboard_asset,
    )
    mount_mcp(app, host=settings.host, port=settings.port, api_key=keys.loopback_key)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/state", responses=_AUTH_ERRORS)
    async def state() -> State:
        return without_key_verifiers(master.state)

    @app.get("/v1/models", responses=_AUTH_ERRORS)
    async def models() -> ModelList:
        return ModelList(data=model_cards(master.state))

    app.include_router(chat_router(master))
    app.include_router(messages_router(master))
    app.include_router(responses_router(master))
    app.include_router(ollama_router(master))
    app.include_router(catalog_router(models_dir, record_preparation, hide_paths, settings.weights_in_memory))
    app.include_router(cluster_router(master))
    mount_dashboard(app)
    return app
