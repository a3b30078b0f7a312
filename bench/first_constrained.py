"""`python -m bench.first_constrained MODEL_DIR`: TTFT of the first constrained request after a load, over HTTP.

A fresh exo node serves the model (no matmul plan to refine, no prefix cache, so every request prefills its whole
prompt). One plain request first takes the costs any first request pays (the first forward pass); then requests
offering the same tool alternate `tool_choice` "required" (a grammar) and "auto" (none, the tool is not strict), each
with its own user message of the same shape. The first "required" one is the first constrained request after the
load: before the runner built llguidance's tokenizer while loading, it paid that build (about 1.5 s for a 152k
vocabulary on a CPU).
"""

import argparse
import asyncio
import os
import statistics
import tempfile
from pathlib import Path

import httpx
from pydantic import BaseModel

from bench.servers import running_exo
from bench.stream_client import request_body, stream_chat
from exo.api.types.openai_chat import ChatMessage, FunctionDefinition, ToolDefinition

WEATHER = ToolDefinition(
    function=FunctionDefinition(
        name="get_weather",
        description="The current weather in a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    )
)
CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul", "Dakar", "Hanoi")


class FirstConstrainedReport(BaseModel):
    first_constrained_ttft_s: float
    later_constrained_ttft_s: list[float]
    unconstrained_ttft_s: list[float]
    prompt_tokens: int
    load_average: tuple[float, float, float]

    @property
    def first_minus_unconstrained_ms(self) -> float:
        return (self.first_constrained_ttft_s - statistics.median(self.unconstrained_ttft_s)) * 1000


def _body(city: str, tool_choice: str) -> dict[str, object]:
    message = ChatMessage(role="user", content=f"What is the weather in {city}?")
    body = request_body([message], [WEATHER], max_tokens=8)
    body["tool_choice"] = tool_choice
    return body


async def _measure(base_url: str, rounds: int) -> FirstConstrainedReport:
    async with httpx.AsyncClient() as client:
        plain = request_body([ChatMessage(role="user", content="Say hi.")], [], max_tokens=2)
        await stream_chat(client, base_url, plain)
        constrained: list[float] = []
        unconstrained: list[float] = []
        prompt_tokens = 0
        for index in range(rounds):
            required = await stream_chat(client, base_url, _body(CITIES[2 * index % len(CITIES)], "required"))
            auto = await stream_chat(client, base_url, _body(CITIES[(2 * index + 1) % len(CITIES)], "auto"))
            constrained.append(required.measurement.ttft_s)
            unconstrained.append(auto.measurement.ttft_s)
            prompt_tokens = required.measurement.prompt_tokens
    return FirstConstrainedReport(
        first_constrained_ttft_s=constrained[0],
        later_constrained_ttft_s=constrained[1:],
        unconstrained_ttft_s=unconstrained,
        prompt_tokens=prompt_tokens,
        load_average=os.getloadavg(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.first_constrained", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--rounds", type=int, default=4)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as work_dir:
        flags = ["--no-matmul-plan", "--prefix-cache-gb", "0"]
        with running_exo(arguments.model, Path(work_dir), flags) as server:
            report = asyncio.run(_measure(server.base_url, arguments.rounds))
    print(report.model_dump_json(indent=1))
    print(f"first constrained - median unconstrained TTFT: {report.first_minus_unconstrained_ms:+.0f} ms")


if __name__ == "__main__":
    main()
