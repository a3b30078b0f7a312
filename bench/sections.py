"""The measured sections: decode speed, agent turns and concurrency against a running server, and the raw baseline."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.raw_worker import RawRequest, RawResult
from bench.results import AgentSeries, AgentTurn, BenchSettings, ConcurrencyRow, DecodeRow, StreamMeasurement
from bench.servers import RunningServer
from bench.stream_client import request_body, stream_chat
from bench.workloads import agent_follow_up, agent_opening, agent_tools, decode_messages
from exo.shared.types.api import ChatMessage
from exo.worker.engines.mlx.blas import blas_environment

WARM_UP_MAX_TOKENS = 4


def decode_row(system: str, runs: list[StreamMeasurement]) -> DecodeRow:
    """TTFT of the first run (its prompt was new to every cache) and the best decode speed of all runs."""
    best = max(runs, key=lambda run: run.decode_tokens_per_s or 0.0)
    return DecodeRow(
        system=system,
        ttft_s=runs[0].ttft_s,
        decode_tokens_per_s=best.decode_tokens_per_s,
        completion_tokens=best.completion_tokens,
        prompt_tokens=runs[0].prompt_tokens,
    )


def run_raw_baseline(model_path: Path, settings: BenchSettings, float32_copy: Path) -> RawResult:
    """Run `bench.raw_worker` in a subprocess with exo's runner environment (BLAS preloaded) and parse its result."""
    request = RawRequest(
        model_path=model_path,
        max_tokens=settings.decode_max_tokens,
        repeats=settings.decode_repeats,
        float32_copy=float32_copy,
    )
    completed = subprocess.run(
        [sys.executable, "-m", "bench.raw_worker", request.model_dump_json()],
        env=blas_environment(os.environ),
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"raw baseline failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
    # Libraries may print to stdout too; the result is the last line.
    return RawResult.model_validate_json(completed.stdout.strip().splitlines()[-1])


async def warm_up(client: httpx.AsyncClient, server: RunningServer) -> None:
    """One short request so model loading and first-call setup are not measured."""
    messages = [ChatMessage(role="user", content="Say hello.")]
    await stream_chat(client, server.base_url, request_body(messages, [], WARM_UP_MAX_TOKENS))


async def measure_decode(
    client: httpx.AsyncClient, server: RunningServer, settings: BenchSettings, with_tools: bool
) -> DecodeRow:
    """Stream the long free-text request `decode_repeats` times, each with a fresh prompt."""
    tools = agent_tools(settings.agent_tool_count) if with_tools else []
    runs: list[StreamMeasurement] = []
    for number in range(1, settings.decode_repeats + 1):
        body = request_body(decode_messages(f"run {number}"), tools, settings.decode_max_tokens)
        runs.append((await stream_chat(client, server.base_url, body)).measurement)
    label = f"{server.name} streaming, {'with' if with_tools else 'no'} tools"
    return decode_row(label, runs)


async def measure_agent(client: httpx.AsyncClient, server: RunningServer, settings: BenchSettings) -> AgentSeries:
    """An opencode-shaped session: every turn resends the whole conversation plus the reply and one new message."""
    tools = agent_tools(settings.agent_tool_count)
    messages = agent_opening(settings.agent_system_chars)
    turns: list[AgentTurn] = []
    for turn in range(1, settings.agent_turns + 1):
        outcome = await stream_chat(client, server.base_url, request_body(messages, tools, settings.agent_max_tokens))
        measurement = outcome.measurement
        turns.append(
            AgentTurn(
                turn=turn,
                prompt_tokens=measurement.prompt_tokens,
                cached_tokens=measurement.cached_tokens,
                ttft_s=measurement.ttft_s,
            )
        )
        messages += agent_follow_up(turn, measurement.text, outcome.tool_call)
    return AgentSeries(system=server.name, turns=turns)


async def measure_concurrency(
    client: httpx.AsyncClient, server: RunningServer, settings: BenchSettings
) -> list[ConcurrencyRow]:
    """For each level N, start N streams at once and time the batch from first request to last token."""
    rows: list[ConcurrencyRow] = []
    for streams in settings.concurrency_levels:
        bodies = [
            request_body(decode_messages(f"stream {index} of {streams}"), [], settings.concurrency_max_tokens)
            for index in range(1, streams + 1)
        ]
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(stream_chat(client, server.base_url, body) for body in bodies))
        wall = time.perf_counter() - started
        measurements = [outcome.measurement for outcome in outcomes]
        total_tokens = sum(measurement.completion_tokens for measurement in measurements)
        rows.append(
            ConcurrencyRow(
                streams=streams,
                aggregate_tokens_per_s=total_tokens / wall,
                # What one client sees: its tokens over its own wall time, waiting and prefill included.
                per_stream_tokens_per_s=sum(m.completion_tokens / m.total_s for m in measurements) / streams,
                mean_ttft_s=sum(m.ttft_s for m in measurements) / streams,
            )
        )
    return rows


def tools_json_chars(settings: BenchSettings) -> int:
    """Size of the tool schemas the agent section sends, as JSON (for the report)."""
    return len(json.dumps([tool.model_dump(exclude_none=True) for tool in agent_tools(settings.agent_tool_count)]))
