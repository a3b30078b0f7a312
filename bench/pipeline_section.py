"""Section 8: ms per token and time to first token of one model over 1, 2 and 3 local nodes (pipeline parallel), and
the aggregate throughput of 1, 2, 4 and 8 streams at once on each.

Each node count gets fresh nodes (`bench.pipeline_nodes`), one untimed warm-up request, then a few greedy streamed
requests of the same prompt one after another, then the same prompt as N streams sent at once for each N, all timed
on the client side over HTTP as a user would see them. Each N-streams run also records the CPU time the nodes used,
which says whether the ranks kept the machine's cores busy or waited on each other. When 2 nodes are measured, the
overlapped micro-batches lever is then measured on its own on a 2-rank split (`bench.pipeline_overlap`).
"""

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from bench.machine import exo_commit
from bench.pipeline_nodes import RunningNodes, model_over_nodes
from bench.pipeline_overlap import measure_overlap
from bench.results import ConcurrentStreams, PipelineRow, PipelineSection, StreamMeasurement
from bench.stream_client import request_body, stream_chat
from exo.api.types.openai_chat import ChatMessage

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and a short example."


def ms_per_token(measurement: StreamMeasurement) -> float:
    """Decode time per token after the first, in milliseconds (prefill excluded)."""
    if measurement.completion_tokens < 2:
        raise RuntimeError(f"a pipeline request produced {measurement.completion_tokens} token(s): nothing to time")
    return (measurement.total_s - measurement.ttft_s) * 1000 / (measurement.completion_tokens - 1)


STREAM_COUNTS = (1, 2, 4, 8)


async def _requests(
    nodes: RunningNodes, max_tokens: int, requests: int, stream_counts: Sequence[int]
) -> tuple[list[StreamMeasurement], list[ConcurrentStreams]]:
    body = request_body([ChatMessage(role="user", content=PROMPT)], (), max_tokens)
    base_url = nodes.base_url
    async with httpx.AsyncClient() as client:
        await stream_chat(client, base_url, body)  # warm-up: first-request compilation and allocation
        runs = [(await stream_chat(client, base_url, body)).measurement for _ in range(requests)]
        concurrent: list[ConcurrentStreams] = []
        for streams in stream_counts:
            cpu_before, started = nodes.cpu_seconds(), time.perf_counter()
            outcomes = await asyncio.gather(*(stream_chat(client, base_url, body) for _ in range(streams)))
            wall_s, cpu_s = time.perf_counter() - started, nodes.cpu_seconds() - cpu_before
            concurrent.append(
                ConcurrentStreams(
                    streams=streams,
                    completion_tokens=sum(outcome.measurement.completion_tokens for outcome in outcomes),
                    wall_s=wall_s,
                    cpu_s=cpu_s,
                )
            )
        return runs, concurrent


def measure_pipeline(
    model_id: str,
    model_path: Path,
    node_counts: Sequence[int],
    max_tokens: int,
    requests: int,
    *,
    stream_counts: Sequence[int] = STREAM_COUNTS,
    overlap_steps: int = 32,
    progress: Callable[[str], None] | None = None,
) -> PipelineSection:
    """Serve `model_path` over each node count in turn and time `requests` streamed requests on each, then each of
    `stream_counts` streams at once; with 2 nodes among them, measure overlapped micro-batches over `overlap_steps`
    decode steps."""
    rows: list[PipelineRow] = []
    for nodes in node_counts:
        with tempfile.TemporaryDirectory(prefix=f"exo-bench-pipeline-{nodes}-") as scratch:
            if progress is not None:
                progress(f"pipeline: {model_id} over {nodes} node(s), waiting for the instance")
            with model_over_nodes(model_path, nodes, Path(scratch)) as running:
                if progress is not None:
                    progress(f"pipeline: {nodes} node(s) ready; {requests} timed request(s)")
                runs, concurrent = asyncio.run(_requests(running, max_tokens, requests, stream_counts))
        rows.append(
            PipelineRow(
                nodes=nodes,
                ttft_s=[run.ttft_s for run in runs],
                ms_per_token=[ms_per_token(run) for run in runs],
                completion_tokens=max(run.completion_tokens for run in runs),
                concurrent=concurrent,
                load_average=os.getloadavg(),
            )
        )
    overlap = None
    if 2 in node_counts:
        if progress is not None:
            progress(f"pipeline: overlapped micro-batches on a 2-rank split, {overlap_steps} steps per configuration")
        try:
            overlap = measure_overlap(model_path, overlap_steps)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            # The node counts' figures are kept: the section renders without the overlap table.
            if progress is not None:
                progress(f"pipeline: the overlap measurement failed ({error}); the section goes on without it")
    load_1, load_5, load_15 = os.getloadavg()
    return PipelineSection(
        rows=rows,
        model_id=model_id,
        max_tokens=max_tokens,
        requests=requests,
        load_average=(load_1, load_5, load_15),
        exo_commit=exo_commit(),
        cpu_count=os.cpu_count(),
        overlap=overlap,
    )
