"""Prompt-lookup speculation: greedy output token for token the output without it, with or without a grammar.

Real forward passes of tiny-qwen-tools with its end-of-sequence ids removed (so every run decodes the full length:
its greedy text soon repeats earlier phrases, which is what lookup drafts catch). Hypothesis draws the prompts, and
for the verification itself, drafts that are right, partly right or wrong at a drawn position. Random-weight models
of every tool-call format check that grammar rollbacks over rejected drafts leave strict calls as plain decoding
writes them.
"""

import json
from collections.abc import Callable, Sequence

import jsonschema
import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo.shared.types.chunks import ErrorChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.tasks import PromptMessage, SamplingParams, ToolPolicy
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.tool_calls.names import ToolFormatName
from exo.worker.engines.mlx.cache.layer_cache import new_prompt_cache
from exo.worker.engines.mlx.chat_template import apply_chat_template
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.draft_policy import DraftPolicy, StepCosts
from exo.worker.engines.mlx.generator.generate import generate_tokens
from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.prompt_lookup import PromptLookup
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.sampling import GREEDY
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from exo.worker.engines.mlx.generator.solo import SoloDecoder, SpeculationStats
from exo.worker.engines.mlx.loaded_model import LoadedModel
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GET_WEATHER_TOOL, user
from tests.fixtures.format_models import FORMAT_MODELS, build_format_model
from tests.worker.engines.mlx.generator.scheduling import JsonBody, engine_context, run, run_alone, task, with_settings

LENGTH = 40
WORDS = ("Hello", "weather", "Paris", "Tokyo", "the", "cat", "sat", "on", "mat", "tool", "call", "!", "?", "\n")
# Every draft verified (not only those the measured costs favour), so what is checked does not depend on the load.
SPECULATING = DecodeSettings(speculation=LookupSettings(adaptive=False))
PLAIN = DecodeSettings(speculation=None)

Proposer = Callable[[list[int], int], list[int]]
"""Given the tokens produced so far and a limit, draft tokens to follow them."""


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> EngineContext:
    return engine_context(endless_copy(tmp_path_factory.mktemp("models")), SPECULATING)


@pytest.fixture(scope="module")
def with_eos() -> EngineContext:
    """The fixture model as trained: a tool-call grammar needs an end-of-sequence token to end on."""
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", SPECULATING)


@pytest.fixture(scope="module")
def drafts_in_property() -> SpeculationStats:
    """Drafts the property test's examples verified, summed over all of them (checked by the test after it)."""
    return SpeculationStats()


def prompt_tokens(loaded: LoadedModel, text: str) -> list[int]:
    return apply_chat_template(loaded.tokenizer, (PromptMessage(role="user", content=text),), ToolPolicy()).tokens


def plain_greedy(loaded: LoadedModel, prompt: Sequence[int]) -> list[int]:
    """The reference: exo's plain decode loop, one token per forward pass."""
    responses = generate_tokens(loaded, prompt, sampling=SamplingParams(), max_tokens=LENGTH)
    return [response.token for response in responses]


def speculative_greedy(
    loaded: LoadedModel,
    prompt: Sequence[int],
    propose: Proposer,
    stats: SpeculationStats,
    policy: DraftPolicy | None = None,
) -> list[int]:
    """Greedy decoding on the solo decoder with drafts from `propose`; at least LENGTH tokens. Without a `policy`
    given, one without measured costs verifies every draft."""
    produced: list[int] = []
    prefill = PromptPrefill(loaded.model, new_prompt_cache(loaded.model), prompt, PiecePacer())
    while not prefill.finished:
        prefill.step()
    decoder = SoloDecoder(
        loaded.model,
        prefill.cache,
        fed=prefill.fed,
        pending=prefill.pending,
        sampler=GREEDY,
        processors=RequestProcessors((), ()),
        drafts=lambda limit: propose(produced, limit) if produced else [],
        policy=policy or DraftPolicy(StepCosts(), maximum=8),
    )
    while len(produced) < LENGTH:
        decoder.launch(LENGTH - len(produced) - 1)
        produced += decoder.collect()
    stats.drafted += decoder.stats.drafted
    stats.accepted += decoder.stats.accepted
    return produced


def lookup_proposer(prompt: Sequence[int]) -> Proposer:
    """The production drafter, fed the tokens as the request would feed it."""
    lookup = PromptLookup(prompt, LookupSettings())

    def propose(produced: list[int], limit: int) -> list[int]:
        lookup.extend(produced[len(lookup) - len(prompt) :])
        return lookup.propose(limit)

    return propose


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=30))
def test_lookup_speculation_gives_the_plain_greedy_tokens(
    endless: EngineContext, drafts_in_property: SpeculationStats, words: list[str]
) -> None:
    loaded = endless.loaded
    prompt = prompt_tokens(loaded, " ".join(words))
    speculated = speculative_greedy(loaded, prompt, lookup_proposer(prompt), drafts_in_property)
    assert speculated[:LENGTH] == plain_greedy(loaded, prompt)


def test_the_property_test_verified_drafts_and_kept_some(drafts_in_property: SpeculationStats) -> None:
    # Runs after the property test (same module, file order): its equality means something only if drafts were
    # both proposed and accepted along the way.
    assert drafts_in_property.accepted > 0
    assert drafts_in_property.drafted > drafts_in_property.accepted


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=10),
    wrong_at=st.integers(min_value=0, max_value=8),
    wrong_token=st.integers(min_value=0, max_value=500),
)
def test_drafts_right_up_to_a_drawn_position_are_kept_exactly_that_far(
    endless: EngineContext, words: list[str], wrong_at: int, wrong_token: int
) -> None:
    loaded = endless.loaded
    prompt = prompt_tokens(loaded, " ".join(words))
    expected = plain_greedy(loaded, prompt)

    def oracle_with_a_mistake(produced: list[int], limit: int) -> list[int]:
        truth = expected[len(produced) : len(produced) + limit]
        if wrong_at < len(truth) and truth[wrong_at] != wrong_token:
            truth[wrong_at] = wrong_token
        return truth

    stats = SpeculationStats()
    assert speculative_greedy(loaded, prompt, oracle_with_a_mistake, stats)[:LENGTH] == expected
    if wrong_at > 0:  # every draft is right up to the mistake, so some of it is always kept
        assert stats.accepted > 0


def test_drafts_the_grammar_forbids_are_cut_before_the_model_sees_them(with_eos: EngineContext) -> None:
    forced: JsonBody = {"messages": [user("Hello!")], "tools": [GET_WEATHER_TOOL], "tool_choice": "required"}
    request = ChatRequest.open(with_eos, task({**forced, "max_tokens": 8}))
    tokenizer = with_eos.loaded.tokenizer
    context = [*request.prefill_tokens]
    request.processors(mx.array(context), mx.zeros((1, len(tokenizer.vocab))))  # the grammar anchors on the prompt
    plain_text: list[int] = tokenizer.encode("Hello! How can I help", add_special_tokens=False)
    call_start: list[int] = tokenizer.encode('<tool_call>\n{"name": "get_weather"', add_special_tokens=False)
    assert request.processors.allowed_draft_length(mx.array(context), plain_text) == 0
    assert request.processors.allowed_draft_length(mx.array(context), [*call_start, *plain_text]) == len(call_start)
    assert request.processors.error is None


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [user("What is the weather in Paris and Tokyo?")], "tools": [GET_WEATHER_TOOL]},
        {"messages": [user("Hello!")], "tools": [GET_WEATHER_TOOL], "tool_choice": "required"},
        {
            "messages": [user("Tell me about Paris weather in Paris.")],
            "tools": [GET_WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    ],
    ids=["streamed calls", "tool_choice required", "tool_choice named"],
)
def test_speculation_composes_with_the_grammar_and_tool_call_streaming(with_eos: EngineContext, body: JsonBody) -> None:
    scheduler = GenerationScheduler(with_eos.loaded.model, with_eos.decode)
    speculated = run(with_eos, {0: [task({**body, "max_tokens": LENGTH})]}, scheduler=scheduler)
    plain = run(with_settings(with_eos, PLAIN), {0: [task({**body, "max_tokens": LENGTH})]})
    (speculated_outcome,), (plain_outcome,) = speculated.values(), plain.values()
    assert speculated_outcome.normalised() == plain_outcome.normalised()
    assert scheduler.speculation.accepted > 0


def test_a_draft_running_past_the_end_of_the_call_is_rolled_back_exactly(with_eos: EngineContext) -> None:
    # Once the grammar has ended, llguidance takes the end-of-sequence token without recording it: a rollback that
    # counted it would take back one real token too many and leave the grammar behind the text.
    named: JsonBody = {
        "messages": [user("Hello!")],
        "tools": [GET_WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    request = ChatRequest.open(with_eos, task({**named, "max_tokens": 8}))
    tokenizer = with_eos.loaded.tokenizer
    context = [*request.prefill_tokens]
    logits = mx.zeros((1, len(tokenizer.vocab)))
    request.processors(mx.array(context), logits)
    call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    draft = [*tokenizer.encode(call_text, add_special_tokens=False), tokenizer.eos_token_id]
    assert request.processors.allowed_draft_length(mx.array(context), draft) == len(draft)
    for position in range(len(draft)):  # what the decoder does when it verifies the draft in one pass
        request.processors(mx.array([*context, *draft[: position + 1]]), logits)
    request.processors.rollback(len(draft) - 1)  # the model kept the draft's first token only
    kept = [*context, draft[0]]
    assert request.processors.allowed_draft_length(mx.array(kept), draft[1:]) == len(draft) - 1
    assert request.processors.error is None


STRICT_WEATHER: JsonBody = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},  # bounded: random weights cannot write digits forever
    },
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def drafts_in_formats() -> SpeculationStats:
    """Drafts the format test below verified, summed over its cases (checked by the test after it)."""
    return SpeculationStats()


@pytest.fixture(scope="module", params=list(FORMAT_MODELS), ids=lambda name: str(name.value))
def format_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> EngineContext:
    """A random-weight model with one family's tokenizer and template (every format the grammar covers)."""
    tool_format: ToolFormatName = request.param
    return engine_context(build_format_model(tmp_path_factory.mktemp("format") / "model", tool_format), SPECULATING)


@pytest.mark.parametrize(
    "question",
    ["What is the weather in Paris?", "Weather in Rome, please.", "Paris or Rome?", "How many days of rain?"],
)
def test_strict_calls_in_every_format_are_the_plain_ones_despite_rejected_drafts(
    format_model: EngineContext, drafts_in_formats: SpeculationStats, question: str
) -> None:
    # Random weights reject many drafts, so the grammar is rolled back again and again, including past the call's
    # end (the rollback that once failed a Qwen3-Coder call).
    tool: JsonBody = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": STRICT_WEATHER, "strict": True},
    }
    body: JsonBody = {
        "messages": [user(question)],
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 200,
    }
    scheduler = GenerationScheduler(format_model.loaded.model, format_model.decode)
    (speculated,) = run(format_model, {0: [task(body)]}, scheduler=scheduler).values()
    (plain,) = run(with_settings(format_model, PLAIN), {0: [task(body)]}).values()
    assert not [chunk for chunk in speculated.chunks if isinstance(chunk, ErrorChunk)]
    assert speculated.normalised() == plain.normalised()
    names = [chunk.name for chunk in speculated.chunks if isinstance(chunk, ToolCallChunk)]
    arguments = "".join(chunk.fragment for chunk in speculated.chunks if isinstance(chunk, ToolCallArgumentsChunk))
    if names or format_model.tool_format is not ToolFormatName.HARMONY:  # GPT-OSS may not leave its analysis
        assert names == ["get_weather"]
        jsonschema.validate(json.loads(arguments), STRICT_WEATHER)
    drafts_in_formats.drafted += scheduler.speculation.drafted
    drafts_in_formats.accepted += scheduler.speculation.accepted


def test_the_format_test_verified_drafts_and_rejected_some(drafts_in_formats: SpeculationStats) -> None:
    assert drafts_in_formats.accepted > 0
    assert drafts_in_formats.drafted > drafts_in_formats.accepted


def test_declined_drafts_are_compared_with_what_the_model_writes_and_verification_comes_back(
    endless: EngineContext,
) -> None:
    loaded = endless.loaded
    prompt = prompt_tokens(loaded, "Hello weather Paris")
    expected = plain_greedy(loaded, prompt)
    costs = StepCosts()
    for fed in range(1, 10):
        costs.record(fed, 1.0 + 0.45 * (fed - 1))  # a draft token costs 0.45 of a pass: pays only where most hold
    policy = DraftPolicy(costs, maximum=8)
    policy.record(drafted=1, accepted=0)  # an early miss: from here every draft is declined...
    assert policy.draft_length(8) == 0
    stats = SpeculationStats()
    produced = speculative_greedy(
        loaded, prompt, lambda produced, limit: expected[len(produced) : len(produced) + limit], stats, policy
    )
    # ...until the declined drafts, checked against the tokens that followed, show that they hold.
    assert produced[:LENGTH] == expected
    assert stats.accepted > 0
    assert policy.acceptance > 0.5


def test_drafts_from_the_escaped_copy_of_a_read_file_leave_the_output_as_plain_decoding_writes_it(
    endless: EngineContext,
) -> None:
    # A read tool's numbered file with quotes and newlines: the lookup also drafts from its JSON-escaped form
    # without the numbers (what an edit's oldString copies), and greedy output must not change.
    source = 'def greet(name):\n    """Say hello."""\n    print(f"hello {name}")\n    return "done"\n'
    numbered = "\n".join(f"{number}: {line}" for number, line in enumerate(source.splitlines(), start=1))
    read: JsonBody = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"filePath": "a.py"}'},
    }
    body: JsonBody = {
        "messages": [
            {"role": "user", "content": "Show me a.py."},
            {"role": "assistant", "content": None, "tool_calls": [read]},
            {"role": "tool", "tool_call_id": "call_1", "content": numbered},
            {"role": "user", "content": 'Hello weather Paris "greet" \\n the cat sat on the mat'},
        ],
        "max_tokens": LENGTH,
        "temperature": 0,
    }
    scheduler = GenerationScheduler(endless.loaded.model, endless.decode)
    one = task(body)
    speculated = run(endless, {0: [one]}, scheduler=scheduler)[one.task_id]
    plain = run_alone(with_settings(endless, PLAIN), task(body))
    assert scheduler.speculation.drafted > 0
    assert speculated.normalised() == plain.normalised()
