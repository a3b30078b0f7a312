"""Pass costs measured before serving (`step_cost_probe.py`): every length from one token up is timed on the model
itself and recorded as the draft policy records its own passes, relative to a one-token pass; the model's state is
left as it was. Uses the q8_0 fixture, whose one-token steps are the CPU engine's decode graph (needs ggml's CPU
library: without it the test skips for a reason of the machine, a failure under EXO_STRICT_SKIPS=1)."""

import mlx.core as mx
import numpy as np
import pytest

from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.generator.draft_policy import DraftPolicy, StepCosts
from exo.worker.engines.mlx.generator.step_cost_probe import measure_step_costs
from tests.worker.engines.mlx.cpu.weight_formats import greedy_step_logits, loaded_fixture


@pytest.mark.usefixtures("ggml")
def test_every_pass_length_is_measured_against_a_one_token_step() -> None:
    model = loaded_fixture("tiny-qwen-tools", "q8_0").model
    assert decode_graph_of(model) is not None
    tokens = mx.array([[5, 17, 42, 9]])
    before = greedy_step_logits(model, tokens, steps=3)
    costs = StepCosts()
    relative = measure_step_costs(model, costs, longest=5)
    assert sorted(relative) == [1, 2, 3, 4, 5]
    assert relative[1] == 1.0
    assert all(cost > 0 for cost in relative.values())
    assert costs.measured() == relative
    # The policy decides from them at once: a draft whose passes cost what was measured.
    policy = DraftPolicy(costs, maximum=4)
    assert 0 <= policy.draft_length(4) <= 4
    after = greedy_step_logits(model, tokens, steps=3)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
