"""`python -m bench.host_overhead MODEL_DIR`: exo's host overhead per decode step on the CPU stand-in (issue 36).

MODEL_DIR is best a reduced random model whose forward pass takes a few milliseconds (`python -m bench.random_model`
with the shape options; docs/PERFORMANCE.md names the one used). A fresh exo node serves it (no matmul plan, so
nothing refines in the background); at each level N greedy streams start at once, each with its own prompt, and
the node's `/metrics` host-overhead counters are read before and after, so the figures are that level's steps
alone: wall time per step, the part spent waiting on the model, the host's own work by part, and a helper thread's
work beside the loop. The level's time to
first token of the first and the last stream to get one shows whether simultaneous prompts wait for each other.
`--json-schema` puts every request under a strict `response_format` schema, so every step computes a grammar mask.
"""

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from bench.servers import running_exo
from bench.stream_client import request_body, stream_chat
from exo.api.types.openai_chat import ChatMessage

STORY_FORMAT: dict[str, object] = {
    "type": "json_schema",
    "json_schema": {
        "name": "story",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
            "required": ["title", "story"],
            "additionalProperties": False,
        },
    },
}
"""`--json-schema`: the answer is held to this schema (a grammar mask at every step)."""
TOPICS = ("cats", "rivers", "trains", "bread", "stars", "rain", "chess", "bees", "ships", "glass", "maps", "snow")


class LevelOverhead(BaseModel):
    streams: int
    steps: int
    """Decode steps with exactly `streams` requests decoding."""
    step_ms: float
    device_ms: float
    prefill_ms: float
    host_ms: float
    host_parts_ms: dict[str, float]
    beside_ms: float = 0.0
    """A helper thread's work per step while the loop went on (tokens accepted beside the next launch): not host
    time of the loop."""
    first_ttft_s: float
    last_ttft_s: float
    aggregate_tokens_per_s: float

    @property
    def host_ms_per_stream(self) -> float:
        return self.host_ms / self.streams

    @property
    def outside_launch_ms(self) -> float:
        """The loop's host work besides `mx.async_eval`: on mlx's CPU backend that call computes most of the pass, so
        this is the host work an accelerator would not hide inside the launch."""
        return self.host_ms - self.host_parts_ms.get("launch", 0.0)


class HostOverheadReport(BaseModel):
    levels: list[LevelOverhead]
    load_average: tuple[float, float, float]


_Series = dict[tuple[str, str, str], float]


def _series(base_url: str) -> _Series:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    found: _Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("exo_decode_step") and sample.name.endswith("_total"):
                found[(sample.name, sample.labels["streams"], sample.labels.get("part", ""))] = sample.value
    return found


async def _level(base_url: str, streams: int, max_tokens: int, schema: bool) -> tuple[list[float], float, int]:
    """TTFTs of `streams` simultaneous requests, the wall time of all of them and the tokens they generated."""
    async with httpx.AsyncClient() as client:
        bodies = [
            request_body(
                [ChatMessage(role="user", content=f"Write a long story about {TOPICS[n % len(TOPICS)]}.")],
                [],
                max_tokens,
            )
            for n in range(streams)
        ]
        if schema:
            bodies = [{**body, "response_format": STORY_FORMAT} for body in bodies]
        started = asyncio.get_running_loop().time()
        outcomes = await asyncio.gather(*(stream_chat(client, base_url, body) for body in bodies))
        wall = asyncio.get_running_loop().time() - started
    return sorted(o.measurement.ttft_s for o in outcomes), wall, sum(o.measurement.completion_tokens for o in outcomes)


def _measure_level(base_url: str, streams: int, max_tokens: int, schema: bool) -> LevelOverhead:
    before = _series(base_url)
    ttfts, wall, tokens = asyncio.run(_level(base_url, streams, max_tokens, schema))
    after = _series(base_url)

    def delta(name: str, part: str = "") -> float:
        key = (name, str(streams), part)
        return after.get(key, 0.0) - before.get(key, 0.0)

    steps = int(delta("exo_decode_steps_total"))
    per_step = 1000 / max(steps, 1)
    parts = {
        part: delta("exo_decode_step_host_seconds_total", part) * per_step
        for (name, level, part) in after
        if name == "exo_decode_step_host_seconds_total" and level == str(streams)
    }
    return LevelOverhead(
        streams=streams,
        steps=steps,
        step_ms=delta("exo_decode_step_seconds_total") * per_step,
        device_ms=delta("exo_decode_step_device_seconds_total") * per_step,
        prefill_ms=delta("exo_decode_step_prefill_seconds_total") * per_step,
        host_ms=sum(parts.values()),
        host_parts_ms=parts,
        beside_ms=delta("exo_decode_step_beside_seconds_total") * per_step,
        first_ttft_s=ttfts[0],
        last_ttft_s=ttfts[-1],
        aggregate_tokens_per_s=tokens / wall,
    )


def render(report: HostOverheadReport) -> str:
    parts = sorted({part for level in report.levels for part in level.host_parts_ms})
    header = [
        "Streams",
        "Steps",
        "Step ms",
        "Device ms",
        "Host ms",
        "Host ms per stream",
        "Host outside launch ms (per stream)",
        *parts,
        "Beside ms",
        "TTFT first / last s",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for level in report.levels:
        cells = [
            str(level.streams),
            str(level.steps),
            f"{level.step_ms:.2f}",
            f"{level.device_ms:.2f}",
            f"{level.host_ms:.2f}",
            f"{level.host_ms_per_stream:.3f}",
            f"{level.outside_launch_ms:.3f} ({level.outside_launch_ms / level.streams:.3f})",
            *(f"{level.host_parts_ms.get(part, 0.0):.3f}" for part in parts),
            f"{level.beside_ms:.3f}",
            f"{level.first_ttft_s:.2f} / {level.last_ttft_s:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every level (each measured on its own)")
    parser.add_argument(
        "--no-overlap",
        action="store_true",
        help="serve with exo's --no-overlap (the next decode step launched only after the last token was handled)",
    )
    parser.add_argument(
        "--no-accept-beside",
        action="store_true",
        help="serve with exo's --no-accept-beside (a step's tokens accepted on the loop after the next launch, not on "
        "a helper thread while it launches)",
    )
    parser.add_argument("--json-schema", action="store_true", help="every request under a strict JSON schema")
    parser.add_argument(
        "--batch-size", type=int, help="serve with exo's --batch-size (its default decodes at most 8 streams together)"
    )
    arguments = parser.parse_args()
    flags = [
        "--no-matmul-plan",
        *(["--batch-size", str(arguments.batch_size)] if arguments.batch_size else []),
        *(["--no-overlap"] if arguments.no_overlap else []),
        *(["--no-accept-beside"] if arguments.no_accept_beside else []),
    ]
    levels: list[LevelOverhead] = []
    with (
        tempfile.TemporaryDirectory() as work_dir,
        running_exo(arguments.model, Path(work_dir), flags) as server,
    ):
        schema = arguments.json_schema
        _measure_level(server.base_url, 1, 8, schema)  # the first request's one-time costs, not measured
        for _ in range(arguments.repeats):
            levels += [_measure_level(server.base_url, n, arguments.max_tokens, schema) for n in arguments.streams]
        report = HostOverheadReport(levels=levels, load_average=os.getloadavg())
    print(report.model_dump_json(indent=1))
    print(render(report))


if __name__ == "__main__":
    main()
