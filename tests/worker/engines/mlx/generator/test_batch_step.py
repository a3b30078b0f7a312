"""The batch step that leaves log-probabilities unevaluated: the same tokens as mlx-lm's own step, and the same
log-probabilities whenever they are read.

Real forward passes of a fixture model through mlx-lm's BatchGenerator, once as mlx-lm ships it and once with
exo's `LazyLogprobsBatch` as its generation batch.
"""

import mlx.core as mx

from exo.shared.types.tasks import SamplingParams
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.generator.sampling import GREEDY, Sampler, SeededSampler
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.generator.batch_generation import PROMPTS, STEPS, generate


def test_greedy_and_sampled_members_get_the_same_tokens_and_exact_logprobs() -> None:
    model = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment()).model
    hot = SamplingParams(temperature=1.5)

    def samplers() -> list[Sampler]:
        return [GREEDY, SeededSampler(hot, 11), GREEDY, SeededSampler(hot, 12)]

    for penalised in (False, True):
        stock_tokens, stock_logprobs = generate(model, samplers(), lazy=False, penalised=penalised)
        lazy_tokens, lazy_logprobs = generate(model, samplers(), lazy=True, penalised=penalised)

        assert lazy_tokens == stock_tokens
        assert all(len(member) == STEPS for member in lazy_tokens)
        for stock_member, lazy_member in zip(stock_logprobs, lazy_logprobs, strict=True):
            for stock, lazy in zip(stock_member, lazy_member, strict=True):
                assert mx.array_equal(stock, lazy).item()


def test_an_all_greedy_batch_gets_mlx_lms_tokens() -> None:
    model = load_model(FIXTURE_MODELS_DIR / "tiny-llama31-tools", ShardAssignment()).model
    stock_tokens, _ = generate(model, [GREEDY] * len(PROMPTS), lazy=False)
    lazy_tokens, lazy_logprobs = generate(model, [GREEDY] * len(PROMPTS), lazy=True)
    assert lazy_tokens == stock_tokens
    # Read now, a lazy row is a distribution over the vocabulary whose largest entry is the greedy token.
    for member_tokens, member_logprobs in zip(lazy_tokens, lazy_logprobs, strict=True):
        for token, row in zip(member_tokens, member_logprobs, strict=True):
            assert abs(mx.logsumexp(row).item()) < 1e-4
            assert mx.argmax(row).item() == token
