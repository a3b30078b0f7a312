"""The measured sections. Systems take turns run by run, so load from other processes falls on all of them alike."""

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from bench.raw_baseline import RawBaseline
from bench.results import (
    AgentSeries,
    AgentTurn,
    ArrivalRow,
    BenchSettings,
    ConcurrencyRow,
    DecodeRow,
    StreamMeasurement,
)
from bench.servers import RunningServer
from bench.stream_client import StreamOutcome, request_body, stream_chat
from bench.workloads import agent_follow_up, agent_opening, agent_tools, decode_messages
from exo.api.types.openai_chat import ChatMessage, ToolDefinition

WARM_UP_MAX_TOKENS = 4

Run = Callable[[str], Awaitable[StreamMeasurement]]
"""One decode run of a system, given the tag that makes its prompt unique."""


@dataclass(frozen=True)
class Contender:
    system: str
    run: Run


def decode_row(system: str, runs: list[StreamMeasurement]) -> DecodeRow:
    """TTFT of the first run (its prompt was new to every cache) and the best decode speed of all runs."""
    best = max(runs, key=lambda run: run.decode_tokens_per_s or 0.0)
    return DecodeRow(
        system=system,
        ttft_s=runs[0].ttft_s,
        decode_tokens_per_s=best.decode_tokens_per_s,
        completion_tokens=best.completion_tokens,
        prompt_tokens=runs[0].prompt_tokens,
        runs=[run.decode_tokens_per_s for run in runs],
    )


def raw_contender(system: str, raw: RawBaseline, max_tokens: int) -> Contender:
    """The in-process mlx-lm loop as a contender (it blocks the event loop, which has nothing else to do then)."""

    async def run(tag: str) -> StreamMeasurement:
        return raw.measure(tag, max_tokens)

    return Contender(system=system, run=run)


def server_contender(
    client: httpx.AsyncClient, server: RunningServer, tools: Sequence[ToolDefinition], max_tokens: int
) -> Contender:
    """A server streaming the decode prompt, with or without `tools` offered."""

    async def run(tag: str) -> StreamMeasurement:
        body = request_body(decode_messages(tag), tools, max_tokens)
        return (await stream_chat(client, server.base_url, body)).measurement

    return Contender(system=f"{server.name} streaming, {'with' if tools else 'no'} tools", run=run)


async def warm_up(client: httpx.AsyncClient, server: RunningServer) -> None:
    """One short request so model loading and first-call setup are not measured."""
    messages = [ChatMessage(role="user", content="Say hello.")]
    await stream_chat(client, server.base_url, request_body(messages, [], WARM_UP_MAX_TOKENS))


async def measure_decode(contenders: Sequence[Contender], repeats: int) -> list[DecodeRow]:
    """Round-robin: run 1 of every contender, then run 2 of every contender, …; each run has a fresh prompt."""
    runs: dict[str, list[StreamMeasurement]] = {contender.system: [] for contender in contenders}
    for number in range(1, repeats + 1):
        for contender in contenders:
            runs[contender.system].append(await contender.run(f"run {number}"))
    return [decode_row(system, measured) for system, measured in runs.items()]


class _AgentSession:
    """One server's copy of the opencode-shaped conversation."""

    def __init__(self, server: RunningServer, settings: BenchSettings) -> None:
        self.server = server
        self.messages = agent_opening(settings.agent_system_chars)
        self.turns: list[AgentTurn] = []

    def record(self, turn: int, outcome: StreamOutcome) -> None:
        measurement = outcome.measurement
        self.turns.append(
            AgentTurn(
                turn=turn,
                prompt_tokens=measurement.prompt_tokens,
                cached_tokens=measurement.cached_tokens,
                ttft_s=measurement.ttft_s,
            )
        )
        self.messages += agent_follow_up(turn, measurement.text, outcome.tool_call)


async def measure_agent(
    client: httpx.AsyncClient, servers: Sequence[RunningServer], settings: BenchSettings
) -> list[AgentSeries]:
    """Each turn resends the whole conversation plus the reply and one new message; servers alternate turn by turn."""
    tools = agent_tools(settings.agent_tool_count)
    sessions = [_AgentSession(server, settings) for server in servers]
    for turn in range(1, settings.agent_turns + 1):
        for session in sessions:
            body = request_body(session.messages, tools, settings.agent_max_tokens)
            session.record(turn, await stream_chat(client, session.server.base_url, body))
    return [AgentSeries(system=session.server.name, turns=session.turns) for session in sessions]


async def _concurrent_streams(
    client: httpx.AsyncClient, server: RunningServer, streams: int, max_tokens: int, tag: str
) -> tuple[float, list[StreamMeasurement]]:
    """Start `streams` distinct requests at once; (aggregate tokens/s from first request to last token, each one)."""
    bodies = [
        request_body(decode_messages(f"{tag}, stream {index} of {streams}"), [], max_tokens)
        for index in range(1, streams + 1)
    ]
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(stream_chat(client, server.base_url, body) for body in bodies))
    wall = time.perf_counter() - started
    measurements = [outcome.measurement for outcome in outcomes]
    return sum(measurement.completion_tokens for measurement in measurements) / wall, measurements


async def measure_concurrency(
    client: httpx.AsyncClient, servers: Sequence[RunningServer], settings: BenchSettings
) -> list[ConcurrencyRow]:
    """For each level N and repeat, each server in turn (the order alternating) starts N streams at once."""
    runs: dict[tuple[int, str], list[tuple[float, list[StreamMeasurement]]]] = {}
    turn = 0
    for streams in settings.concurrency_levels:
        for repeat in range(1, settings.concurrency_repeats + 1):
            ordered = servers if turn % 2 == 0 else list(reversed(servers))
            turn += 1
            for server in ordered:
                tag = f"{server.name} repeat {repeat}"
                measured = await _concurrent_streams(client, server, streams, settings.concurrency_max_tokens, tag)
                runs.setdefault((streams, server.name), []).append(measured)
    rows: list[ConcurrencyRow] = []
    for (streams, system), repeats in runs.items():
        every = [measurement for _, measurements in repeats for measurement in measurements]
        rows.append(
            ConcurrencyRow(
                streams=streams,
                system=system,
                aggregate_tokens_per_s=sum(aggregate for aggregate, _ in repeats) / len(repeats),
                # What one client sees: its tokens over its own wall time, waiting and prefill included.
                per_stream_tokens_per_s=sum(m.completion_tokens / m.total_s for m in every) / len(every),
                mean_ttft_s=sum(m.ttft_s for m in every) / len(every),
                runs=[aggregate for aggregate, _ in repeats],
            )
        )
    return rows


async def measure_arrival(
    client: httpx.AsyncClient, servers: Sequence[RunningServer], settings: BenchSettings
) -> list[ArrivalRow]:
    """A request sent while `arrival_running_streams` others decode: its time to first token, and the same request's
    with nothing else running, each server in turn."""
    rows: list[ArrivalRow] = []
    running = settings.arrival_running_streams
    for server in servers:
        alone = await stream_chat(client, server.base_url, _arrival_body(server, "alone", settings))
        started = [asyncio.Event() for _ in range(running)]
        busy = [
            asyncio.create_task(
                stream_chat(client, server.base_url, _arrival_body(server, f"busy {index}", settings), started[index])
            )
            for index in range(running)
        ]
        await asyncio.gather(*(event.wait() for event in started))
        arriving = await stream_chat(client, server.base_url, _arrival_body(server, "arriving", settings))
        await asyncio.gather(*busy)
        rows.append(
            ArrivalRow(
                system=server.name,
                running_streams=running,
                ttft_s=arriving.measurement.ttft_s,
                alone_ttft_s=alone.measurement.ttft_s,
            )
        )
    return rows


def _arrival_body(server: RunningServer, tag: str, settings: BenchSettings) -> dict[str, object]:
    return request_body(decode_messages(f"{server.name} arrival {tag}"), [], settings.arrival_max_tokens)
