"""Sampling knobs reach mlx-lm's sampler and logits processors: real fixture model, real forward passes."""

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import greedy_sampler, make_sampler

from exo.shared.types.tasks import PromptMessage, SamplingParams, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.chat_template import apply_chat_template
from exo.worker.engines.mlx.generator.generate import generate_tokens
from exo.worker.engines.mlx.generator.sampling import (
    GREEDY,
    GREEDY_BELOW_TEMPERATURE,
    InvalidSamplingError,
    check_sampling,
    greedy_rows,
    make_request_sampler,
    sample_rows,
    sampling_temperature,
)
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GET_WEATHER_TOOL, GREETING_REPLY

SEEDS = range(5)
HOT = 2.0  # hot enough that untruncated sampling leaves the fixture's trained answer


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(Path(FIXTURE_MODELS_DIR / "tiny-qwen-tools"), ShardAssignment())


def complete(loaded: LoadedModel, content: str, sampling: SamplingParams, *, with_weather: bool = False) -> str:
    tools = (ToolSpec.model_validate(GET_WEATHER_TOOL["function"]),) if with_weather else ()
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


@pytest.mark.parametrize("temperature", [1e-39, 1e-20, 5e-5])
def test_a_vanishing_temperature_samples_greedily(loaded: LoadedModel, temperature: float) -> None:
    # Unguarded, 1 / temperature overflows (float32 below ~3e-39, half precision below ~1.5e-5) and every seed
    # samples a different garbage answer.
    for seed in SEEDS:
        assert complete(loaded, "Hello!", SamplingParams(temperature=temperature, seed=seed)) == GREETING_REPLY


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        (SamplingParams(seed=-1), "seed"),
        (SamplingParams(seed=2**64), "seed"),
        (SamplingParams(top_k=741), "top_k"),
        (SamplingParams(top_k=10**9, temperature=0.7), "top_k"),
        (SamplingParams(top_k=-2), "top_k"),
    ],
)
def test_values_mlx_cannot_sample_with_are_refused_naming_the_field(
    loaded: LoadedModel, sampling: SamplingParams, param: str
) -> None:
    assert loaded.vocabulary_size == 741
    with pytest.raises(InvalidSamplingError) as refused:
        check_sampling(sampling, loaded.vocabulary_size)
    assert refused.value.param == param


def test_the_edges_of_the_ranges_sample(loaded: LoadedModel) -> None:
    for sampling in (SamplingParams(seed=0, top_k=740, temperature=0.5), SamplingParams(seed=2**64 - 1, top_k=1)):
        check_sampling(sampling, loaded.vocabulary_size)
        assert complete(loaded, "Hello!", sampling)


@pytest.mark.parametrize("temperature", [GREEDY_BELOW_TEMPERATURE / 100, GREEDY_BELOW_TEMPERATURE])
def test_the_greedy_threshold_covers_half_precision_logits(temperature: float) -> None:
    # The runner samples in the model's dtype; half precision overflows first (1 / 1.5e-5 > 65504), so the threshold
    # is set for it: at and above it mlx-lm's own sampler still picks the likeliest token from float16 logprobs.
    mx.random.seed(3)
    logits = mx.random.normal((1, 741)) * 5
    logprobs = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float16)
    sampler = make_sampler(temp=sampling_temperature(temperature))
    picks: set[object] = {sampler(logprobs).item() for _ in range(20)}
    assert picks == {mx.argmax(logprobs).item()}


def test_sample_rows_picks_what_sampling_normalized_log_probabilities_picks(loaded: LoadedModel) -> None:
    # sample_rows skips the normalization for a greedy row (the pipeline leader's and the solo decoder's rows): the
    # tokens must be those of the normalized log-probabilities, for the fixture model's real logits and random ones.
    prompt = apply_chat_template(loaded.tokenizer, (PromptMessage(role="user", content="Hello!"),), ToolPolicy())
    real = loaded.model(mx.array([prompt.tokens]))[0]  # one row per prompt position
    noise = mx.random.normal((64, real.shape[-1]), key=mx.random.key(7)) * 4.0
    for logits in (real, noise):
        normalized = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        greedy = _ids(sample_rows(GREEDY, logits))
        assert greedy == _ids(greedy_sampler(normalized))
        assert _ids(sample_rows(GREEDY, logits, on_host=True)) == greedy  # numpy's pick, for logits on the host
        assert len(set(greedy)) > 1  # the control: rows that differ
        hot = SamplingParams(temperature=HOT, top_p=0.9, seed=3)
        drawn = _ids(sample_rows(make_request_sampler(hot), logits))
        assert drawn == _ids(make_request_sampler(hot)(normalized))
        assert drawn != greedy  # the control: the seeded draw is not the argmax


def test_a_pick_on_the_host_takes_the_first_of_equal_logits_as_mlx_does() -> None:
    logits = mx.zeros((3, 1000))
    logits = logits.at[0, 7].add(2.0).at[0, 900].add(2.0).at[1, 999].add(1.0).at[2, 0].add(-1.0)
    assert _ids(greedy_rows(logits, on_host=True)) == _ids(greedy_rows(logits)) == [7, 999, 1]


def _ids(tokens: mx.array) -> list[int]:
    return [int(token) for token in tokens.reshape(-1).tolist()]  # pyright: ignore[reportGeneralTypeIssues,reportUnknownVariableType,reportUnknownArgumentType]
