"""Greedy references per weights format for the fixture models, on prompts they were not trained on.

On their trained prompts every fixture model answers exactly as trained in float32 and in int8
(test_int8_layers.py). Off them the continuation is whatever the weights make of it, decided by small logit margins,
which is where int8's (or Q8_0's) rounding can change a token. These prompts are the trained ones with the last user
message changed; `python -m tests.worker.engines.mlx.cpu.greedy_references` writes every format's greedy output to
greedy_references.json, which test_greedy_references.py pins (q8_0 needs ggml's CPU library: `uv run exo ggml
build`).
"""

import json
from pathlib import Path
from typing import Literal

from exo.shared.types.api import JsonObject
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.client_requests import CLAUDE_CODE_CASES
from tests.fixtures.fixture_specs import (
    AGENT_CASES,
    FIXTURE_MODELS_DIR,
    LLAMA31_TOOLS_CASES,
    QWEN_TOOLS_CASES,
    FixtureCase,
    FixtureModelName,
)
from tests.fixtures.model_builder.verify import greedy_generate, load_model

REFERENCES = Path(__file__).with_name("greedy_references.json")
MAX_TOKENS = 24
CASES_PER_MODEL = 4
WeightsFormat = Literal["float32", "int8", "q8_0"]
FORMATS: tuple[WeightsFormat, ...] = ("float32", "int8", "q8_0")
TABLES: dict[FixtureModelName, tuple[FixtureCase, ...]] = {
    "tiny-qwen-tools": QWEN_TOOLS_CASES,
    "tiny-llama31-tools": LLAMA31_TOOLS_CASES,
    "tiny-qwen-agent": AGENT_CASES,
    "tiny-qwen-claude-code": CLAUDE_CODE_CASES,
}


def untrained(case: FixtureCase) -> tuple[JsonObject, ...]:
    """`case`'s messages with its last user message asked a second time, differently worded."""
    messages = [dict(message) for message in case.messages]
    last = max(index for index, message in enumerate(messages) if message.get("role") == "user")
    content = messages[last].get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    messages[last]["content"] = f"Once more, and differently: {text}"
    return tuple(messages)


def greedy_outputs(name: FixtureModelName, weights: WeightsFormat) -> dict[str, str]:
    """Each untrained prompt's greedy text (and stop token) from `name` loaded as a runner loads it."""
    loaded = exo_load_model(
        FIXTURE_MODELS_DIR / name, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights=weights)
    )
    assert loaded.dtype == weights, loaded.dtype
    fixture = load_model(FIXTURE_MODELS_DIR / name).model_copy(update={"model": loaded.model})
    outputs: dict[str, str] = {}
    for case in TABLES[name][:CASES_PER_MODEL]:
        output = greedy_generate(fixture, untrained(case), case.tools, max_tokens=MAX_TOKENS)
        outputs[case.name] = output.text + (f"<{output.stop_token}>" if output.stop_token else "")
    return outputs


def main() -> None:
    references = {name: {weights: greedy_outputs(name, weights) for weights in FORMATS} for name in TABLES}
    REFERENCES.write_text(json.dumps(references, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
