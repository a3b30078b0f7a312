"""Sampling knobs reach mlx-lm's sampler and logits processors: real fixture model, real forward passes."""

from pathlib import Path

import pytest

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import PromptMessage, SamplingParams, ToolPolicy
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.generator.generate import generate_tokens
from exo.worker.engines.mlx.utils_mlx import LoadedModel, apply_chat_template, load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GET_WEATHER_TOOL, GREETING_REPLY

SEEDS = range(5)
HOT = 2.0  # hot enough that untruncated sampling leaves the fixture's trained answer


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(Path(FIXTURE_MODELS_DIR / "tiny-qwen-tools"), ShardAssignment())


def complete(loaded: LoadedModel, content: str, sampling: SamplingParams, *, with_weather: bool = False) -> str:
    tools = (FunctionDefinition.model_validate(GET_WEATHER_TOOL["function"]),) if with_weather else ()
    prompt = apply_chat_template(
        loaded.tokenizer, (PromptMessage(role="user", content=content),), ToolPolicy(tools=tools)
    )
    return "".join(
        response.text for response in generate_tokens(loaded, prompt.tokens, sampling=sampling, max_tokens=60)
    )


def test_hot_sampling_without_truncation_strays_from_the_greedy_answer(loaded: LoadedModel) -> None:
    # The control for the two tests below: at this temperature the knobs are what keeps the answer greedy.
    answers = {complete(loaded, "Hello!", SamplingParams(temperature=HOT, seed=seed)) for seed in SEEDS}
    assert answers - {GREETING_REPLY}


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"min_p": 1.0}])
def test_top_k_1_and_min_p_1_keep_only_the_most_likely_token(loaded: LoadedModel, truncation: dict[str, float]) -> None:
    for seed in SEEDS:
        sampling = SamplingParams.model_validate({"temperature": HOT, "seed": seed, **truncation})
        assert complete(loaded, "Hello!", sampling) == GREETING_REPLY


def test_repetition_penalty_changes_a_greedy_answer_that_repeats_the_prompt(loaded: LoadedModel) -> None:
    # "Hello" is in the prompt and starts the answer: a strong penalty must push the model off it.
    assert complete(loaded, "Hello!", SamplingParams()) == GREETING_REPLY
    assert complete(loaded, "Hello!", SamplingParams(repetition_penalty=5.0)) != GREETING_REPLY


def test_frequency_penalty_breaks_the_second_of_two_identical_calls(loaded: LoadedModel) -> None:
    question = "What is the weather in Paris and Tokyo?"
    plain = complete(loaded, question, SamplingParams(), with_weather=True)
    penalised = complete(loaded, question, SamplingParams(frequency_penalty=2.0), with_weather=True)
    assert plain.count("<tool_call>") == 2
    assert penalised != plain
