"""Find the node and the model a client is to use: the one served, or the one asked for."""

from collections.abc import Sequence
from typing import Final

import anyio

from exo.launch.plan import LaunchError
from exo.mcp.node_client import NodeApiError, NodeClient, NodeUnreachableError
from exo.shared.types.api import ModelCard

# NodeClient's message says how to start a node here; a node elsewhere is named with --url.
ELSEWHERE_HINT: Final = "For a node elsewhere, pass --url http://HOST:PORT"


def node_root(url: str) -> str:
    """The node's root URL as clients want it: no trailing slash and no /v1 (each client adds its own path)."""
    root = url.strip().rstrip("/")
    return root.removesuffix("/v1").rstrip("/")


async def _served(url: str, api_key: str | None) -> list[ModelCard]:
    async with NodeClient(url, api_key) as client:
        return (await client.models()).data


def served_models(url: str, api_key: str | None) -> list[ModelCard]:
    """The models the node at `url` lists; LaunchError when nothing answers there or it refuses."""
    try:
        return anyio.run(_served, url, api_key)
    except NodeUnreachableError as error:
        raise LaunchError(f"{error}. {ELSEWHERE_HINT}") from error
    except NodeApiError as error:
        raise LaunchError(f"the exo node at {url} answered /v1/models with an error: {error}") from error


def choose_model(cards: Sequence[ModelCard], requested: str | None, url: str) -> ModelCard:
    """The card of `requested`, or of the only model served; LaunchError naming the choices otherwise."""
    served = ", ".join(card.id for card in cards)
    if requested is not None:
        for card in cards:
            if card.id == requested:
                return card
        if not cards:
            raise LaunchError(
                f"model {requested!r} is not served: the node at {url} serves no model. "
                f"Start one with `uv run exo --model {requested}`"
            )
        raise LaunchError(
            f"model {requested!r} is not served by the node at {url}; it serves: {served}. Pass one of them with "
            f"--model, or start a node with `uv run exo --model {requested}`"
        )
    if not cards:
        raise LaunchError(
            f"the node at {url} serves no model (started with --no-model, or its models are still being placed): "
            f"start one with `uv run exo --model ID` (`uv run exo models` lists them)"
        )
    if len(cards) > 1:
        raise LaunchError(f"the node at {url} serves several models: {served}. Choose one with --model")
    return cards[0]
