"""What rig_hop_cost measures beside one request's decode speed, with `--extras` (issue 34's list): several streams
at once (aggregate tok/s), a long prompt read (prompt tok/s from the time to first token) and each rank's memory
(planned by placement, and the weights its runner holds as loaded). Run at no added delay, for a split and for the
model on one node alike."""

import asyncio
import statistics
import time
from typing import Any

import httpx

from bench.stream_client import request_body, stream_chat
from exo.api.types.openai_chat import ChatMessage
from exo.shared.types.cluster_api import PlacedInstanceView
from tests.cluster.netns_rig import NetnsRig, RigNode

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short example."
LONG_PROMPT_REPEATS = 40  # about 2,100 prompt tokens with the test models' tokenizer


def _body(model: str, content: str, max_tokens: int) -> dict[str, object]:
    body = request_body([ChatMessage(role="user", content=content)], (), max_tokens)
    body["model"] = model
    return body


def streams_at_once(rig: NetnsRig, node: RigNode, model: str, max_tokens: int, streams: int) -> dict[str, Any]:
    """`streams` greedy requests sent together (each a different prompt, so no cache serves one from another):
    the tokens of all over the time from the first sent to the last finished."""

    async def run() -> tuple[float, int]:
        async with httpx.AsyncClient(timeout=600) as client:
            started = time.monotonic()
            outcomes = await asyncio.gather(*(
                stream_chat(client, node.base_url, _body(model, f"{index}. {PROMPT}", max_tokens))
                for index in range(streams)
            ))  # fmt: skip
            return time.monotonic() - started, sum(outcome.measurement.completion_tokens for outcome in outcomes)

    elapsed, tokens = rig.call(node, lambda: asyncio.run(run()))
    return {"streams": streams, "tokens": tokens, "seconds": elapsed, "aggregate_tokens_per_s": tokens / elapsed}


def prefill(rig: NetnsRig, node: RigNode, model: str, requests: int) -> dict[str, Any]:
    """Long prompts, each new to every cache: prompt tokens over the time to first token (which includes one
    decode step), the median of `requests`."""

    async def run() -> list[tuple[int, float]]:
        async with httpx.AsyncClient(timeout=600) as client:
            measured: list[tuple[int, float]] = []
            for index in range(requests):
                content = f"Request {index} at {time.time()}. " + " ".join([PROMPT] * LONG_PROMPT_REPEATS)
                outcome = await stream_chat(client, node.base_url, _body(model, content, 2))
                measured.append((outcome.measurement.prompt_tokens, outcome.measurement.ttft_s))
            return measured

    measured = rig.call(node, lambda: asyncio.run(run()))
    rates = [tokens / seconds for tokens, seconds in measured]
    return {
        "prompt_tokens": [tokens for tokens, _ in measured],
        "ttft_s": [seconds for _, seconds in measured],
        "median_prompt_tokens_per_s": statistics.median(rates),
    }


def rank_memory(instance: PlacedInstanceView, runners: dict[str, Any]) -> list[dict[str, Any]]:
    """Each rank's node, the memory placement planned for it (its weights plus room to serve) and the bytes of
    weights its runner reports holding as loaded (`runners`: /state's runners; None where a runner did not say)."""
    return [
        {
            "rank": rank.rank,
            "node": rank.node_name,
            "planned_bytes": rank.planned_bytes,
            "weights_bytes": (runners.get(rank.runner_id or "", {}).get("metadata") or {}).get("weights_bytes"),
        }
        for rank in instance.ranks
    ]
