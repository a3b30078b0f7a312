"""The sections that need several systems up at once: decode, agent turns, concurrent streams and arrivals.

The systems compared in a section stay loaded for the whole section so their runs can take turns (the machine has
memory for three copies of a small model; none of them uses CPU while idle).
"""

import asyncio
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.raw_baseline import RawBaseline, running_raw_baseline, running_stock_baseline
from bench.results import RAW, RAW_REPLACED, AgentSeries, ArrivalRow, BenchSettings, ConcurrencyRow, DecodeRow
from bench.sections import (
    measure_agent,
    measure_arrival,
    measure_concurrency,
    measure_decode,
    raw_contender,
    server_contender,
    warm_up,
)
from bench.servers import RunningServer, running_exo, running_mlx_lm_server
from bench.workloads import agent_tools


@dataclass(frozen=True)
class ServerSections:
    decode: list[DecodeRow]
    agent: list[AgentSeries]
    concurrency: list[ConcurrencyRow]
    arrival: list[ArrivalRow]
    matmul_gflops: float
    """Float32 matmul speed in the raw baseline's process (where the BLAS preload applies)."""
    batch_pass_seconds: dict[int, float]
    """Bare mlx-lm: best seconds of one decode step over N sequences, for the stream counts measured (and 3)."""
    planned_batch_pass_seconds: dict[int, float]
    """The same steps with exo's matmul plan installed."""


QUEUED_EXO = "exo --batch-size 1"
"""exo serving one request at a time (continuous batching off), for the concurrency and arrival sections."""


async def _measure_single_streams(
    baselines: tuple[RawBaseline, RawBaseline],
    exo: RunningServer,
    peer: RunningServer,
    settings: BenchSettings,
    progress: Callable[[str], None],
) -> tuple[list[DecodeRow], list[AgentSeries]]:
    stock, replaced = baselines
    async with httpx.AsyncClient() as client:
        for server in (exo, peer):
            await warm_up(client, server)
        tokens = settings.decode_max_tokens
        tools = agent_tools(settings.agent_tool_count)
        progress("decode without tools: stock mlx-lm, mlx-lm with exo's replacements, exo, mlx_lm.server in turn")
        raws = [raw_contender(RAW, stock, tokens), raw_contender(RAW_REPLACED, replaced, tokens)]
        plain = [*raws, *(server_contender(client, s, [], tokens) for s in (exo, peer))]
        decode = await measure_decode(plain, settings.decode_repeats)
        progress("decode with tools: exo, mlx_lm.server in turn")
        with_tools = [server_contender(client, server, tools, tokens) for server in (exo, peer)]
        decode += await measure_decode(with_tools, settings.decode_repeats)
        progress("agent turns: exo, mlx_lm.server in turn")
        agent = await measure_agent(client, (exo, peer), settings)
    return decode, agent


async def _measure_concurrent(
    servers: tuple[RunningServer, ...], settings: BenchSettings, progress: Callable[[str], None]
) -> tuple[list[ConcurrencyRow], list[ArrivalRow]]:
    async with httpx.AsyncClient() as client:
        await warm_up(client, servers[1])
        names = ", ".join(server.name for server in servers)
        progress(f"concurrent streams: {names} in turn at each level")
        concurrency = await measure_concurrency(client, servers, settings)
        progress(f"a request arriving while others decode: {names}")
        arrival = await measure_arrival(client, servers, settings) if settings.arrival_running_streams else []
    return concurrency, arrival


def measure_with_servers(
    model_path: Path, settings: BenchSettings, work_dir: Path, progress: Callable[[str], None]
) -> ServerSections:
    """Start the systems on `model_path` (mlx_lm.server on the same float32 weights), measure, stop them.

    Both raw baselines give their memory to exo with batching off once the single-stream sections are done."""
    float32_copy = work_dir / "float32-model"
    progress("starting mlx-lm with exo's replacements (it writes the float32 copy), stock mlx-lm, exo, mlx_lm.server")
    with ExitStack() as servers:
        with ExitStack() as baseline:
            replaced = baseline.enter_context(running_raw_baseline(model_path, float32_copy))
            stock = baseline.enter_context(running_stock_baseline(float32_copy))
            exo = servers.enter_context(running_exo(model_path, work_dir))
            peer = servers.enter_context(running_mlx_lm_server(float32_copy, work_dir))
            decode, agent = asyncio.run(_measure_single_streams((stock, replaced), exo, peer, settings, progress))
            matmul_gflops = replaced.ready.matmul_gflops or 0.0
            progress("stock mlx-lm: a decode step over several sequences against one over a single sequence")
            rows = sorted({1, 3, *settings.concurrency_levels})
            batch_pass_seconds = stock.pass_costs(rows, settings.pass_cost_repeats)
            progress("the same steps with exo's matmul plan")
            planned_batch_pass_seconds = replaced.pass_costs(rows, settings.pass_cost_repeats, planned=True)
        progress(f"starting {QUEUED_EXO} in the raw baseline's place")
        queued = servers.enter_context(running_exo(model_path, work_dir, ["--batch-size", "1"], QUEUED_EXO))
        concurrency, arrival = asyncio.run(_measure_concurrent((exo, queued, peer), settings, progress))
    return ServerSections(
        decode, agent, concurrency, arrival, matmul_gflops, batch_pass_seconds, planned_batch_pass_seconds
    )
