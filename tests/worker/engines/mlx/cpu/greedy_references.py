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
from tests.fixtures.fixture_specs import (
    FixtureCase,
    FixtureModelName,
)
from tests.fixtures.model_builder.verify import greedy_generate
from tests.worker.engines.mlx.cpu.weight_formats import TABLES, loaded_fixture

REFERENCES = Path(__file__).with_name("greedy_references.json")
MAX_TOKENS = 24
CASES_PER_MODEL = 4
WeightsFormat = Literal["float32", "int8", "q8_0"]
FORMATS: tuple[WeightsFormat, ...] = ("float32", "int8", "q8_0")


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
    fixture = loaded_fixture(name, weights)
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
