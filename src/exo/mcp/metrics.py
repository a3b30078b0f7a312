"""exo_performance_metrics: per node and per model, what the cluster has served and how fast, with rates measured
over a short sampling window (requests/s and tokens/s need two readings)."""

import time

import anyio
from pydantic import Field
from rich.filesize import decimal

from exo.mcp.node_client import NodeClient
from exo.shared.types.cluster_api import ClusterMetrics, RequestMetrics
from exo.shared.types.common import FrozenModel

DEFAULT_SAMPLE_SECONDS = 5.0


class Rates(FrozenModel):
    """Throughput over the sampling window for one node or one model."""

    name: str
    requests_per_second: float
    generated_tokens_per_second: float


class PerformanceMetrics(FrozenModel):
    metrics: ClusterMetrics = Field(description="the counters and means at the end of the window")
    sample_seconds: float
    node_rates: list[Rates] = Field(default_factory=list[Rates])
    model_rates: list[Rates] = Field(default_factory=list[Rates])


def _rate(before: RequestMetrics | None, after: RequestMetrics, name: str, seconds: float) -> Rates:
    requests = after.requests_finished - (before.requests_finished if before else 0)
    tokens = after.generated_tokens - (before.generated_tokens if before else 0)
    return Rates(
        name=name,
        requests_per_second=round(max(requests, 0) / seconds, 3),
        generated_tokens_per_second=round(max(tokens, 0) / seconds, 2),
    )


def _figures(metrics: RequestMetrics) -> str:
    ttft = f"{metrics.time_to_first_token_seconds:.2f} s" if metrics.time_to_first_token_seconds is not None else "-"
    decode = f"{metrics.decode_tokens_per_second:.1f}" if metrics.decode_tokens_per_second is not None else "-"
    return (
        f"{metrics.requests_finished} requests ({metrics.requests_failed} failed, {metrics.requests_cancelled} "
        f"cancelled), {metrics.generated_tokens} tokens generated, time to first token {ttft}, decode {decode} "
        f"tokens/s, {metrics.tasks_running} running, queue depth {metrics.queue_depth}"
    )


def describe_performance(performance: PerformanceMetrics) -> str:
    """Per node and per model: counters, means, memory, and the window's rates."""
    rates = {rate.name: rate for rate in [*performance.node_rates, *performance.model_rates]}

    def window(name: str) -> str:
        rate = rates.get(name)
        if rate is None:
            return ""
        return (
            f"; over the last {performance.sample_seconds:g} s: {rate.requests_per_second:g} requests/s, "
            f"{rate.generated_tokens_per_second:g} tokens/s"
        )

    lines = ["Nodes:"]
    for node in performance.metrics.nodes:
        memory = f"{decimal(node.memory_available_bytes)} free of {decimal(node.memory_total_bytes)}"
        lines.append(
            f"- {node.name} [{node.node_id}] ({node.status}, {memory}): {_figures(node)}{window(node.node_id)}"
        )
    lines.append("Models:" if performance.metrics.models else "Models: none.")
    for model in performance.metrics.models:
        lines.append(f"- {model.model_id}: {_figures(model)}{window(model.model_id)}")
    return "\n".join(lines)


async def performance_metrics(client: NodeClient, sample_seconds: float) -> PerformanceMetrics:
    """The cluster's metrics; with a window, read twice and report the rates in between."""
    if sample_seconds <= 0:
        return PerformanceMetrics(metrics=await client.cluster_metrics(), sample_seconds=0.0)
    before = await client.cluster_metrics()
    started = time.monotonic()
    await anyio.sleep(sample_seconds)
    after = await client.cluster_metrics()
    seconds = time.monotonic() - started
    nodes_before = {node.node_id: node for node in before.nodes}
    models_before = {model.model_id: model for model in before.models}
    return PerformanceMetrics(
        metrics=after,
        sample_seconds=round(seconds, 2),
        node_rates=[_rate(nodes_before.get(node.node_id), node, node.node_id, seconds) for node in after.nodes],
        model_rates=[
            _rate(models_before.get(model.model_id), model, model.model_id, seconds) for model in after.models
        ],
    )
