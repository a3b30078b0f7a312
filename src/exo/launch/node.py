"""Find the node and the model a client is to use: the one served, or the one asked for."""

import time
from collections.abc import Callable, Sequence
from typing import Final

import anyio

from exo.launch.plan import LaunchError
from exo.mcp.node_client import NodeApiError, NodeClient, NodeUnreachableError
from exo.shared.types.api import ModelCard

# NodeClient's message says how to start a node here; a node elsewhere is named with --url.
ELSEWHERE_HINT: Final = "For a node elsewhere, pass --url http://HOST:PORT"
# A launch right after `exo` starts waits while the node prepares and loads the model: the client's configuration
# needs the context length its runner reads. Past this it stops and says so.
MODEL_WAIT_SECONDS: Final = 1800.0
_POLL_SECONDS: Final = 1.0
_SAY_EVERY_SECONDS: Final = 10.0


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


def described_model(
    url: str,
    api_key: str | None,
    requested: str | None,
    say: Callable[[str], None],
    *,
    wait_seconds: float = MODEL_WAIT_SECONDS,
    poll_seconds: float = _POLL_SECONDS,
) -> ModelCard:
    """The chosen model's card (`choose_model`) once the node knows its context length, waiting while the model is
    being prepared or loaded and saying how far it got (at each new stage, and every few seconds); LaunchError if its
    load failed (with the node's reason) or the wait runs out."""
    deadline = time.monotonic() + wait_seconds
    said_at = 0.0
    said_stage: tuple[str | None, str | None] = (None, None)
    while True:
        card = choose_model(served_models(url, api_key), requested, url)
        if card.status == "failed":
            raise LaunchError(f"model {card.id!r} cannot be served by the node at {url}: {card.error}")
        if card.context_length is not None or card.status not in ("preparing", "loading"):
            return card
        now = time.monotonic()
        if now >= deadline:
            raise LaunchError(
                f"model {card.id!r} is still {card.status} on the node at {url} after {wait_seconds:.0f} s: run "
                f"`exo launch` again once /v1/models lists it ready"
            )
        stage = (card.status, card.preparation.phase if card.preparation is not None else None)
        if stage != said_stage or now - said_at >= _SAY_EVERY_SECONDS:
            say(f"waiting for {card.id}: {_progress(card)}")
            said_at, said_stage = now, stage
        time.sleep(poll_seconds)


def _progress(card: ModelCard) -> str:
    preparation = card.preparation
    if preparation is None or preparation.total_bytes <= 0:
        return "the node is loading it" if card.status == "loading" else "the node is preparing it"
    share = preparation.done_bytes / preparation.total_bytes
    return f"{preparation.phase} {share:.0%} of {preparation.total_bytes / 1e6:.1f} MB"
