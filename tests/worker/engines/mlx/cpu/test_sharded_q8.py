"""A tensor rank's sharded layers under `--cpu-weights q8_0`: mlx-lm's `shard` turns q/k/v and gate/up into
all-to-sharded linears and o_proj/down_proj into sharded-to-all ones; the Q8_0 conversion then holds each as Q8_0
blocks of the rank's slice (the sharded-to-all ones summing their partial products over the group), and the MLP
stays one fused ggml graph.

Run in one process: mlx's group of one (no distributed backend) shards every matrix whole, so the rank's model must
compute exactly what the whole q8_0 model does; the 2-rank split is tests/worker/runner/test_tensor_q8.py.
"""

from collections.abc import Callable
from typing import cast

import mlx.core as mx
import numpy as np
from mlx import nn
from mlx.nn.layers.distributed import ShardedToAllLinear
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from exo.worker.engines.mlx.cpu.engine import held_bytes
from exo.worker.engines.mlx.cpu.ggml_library import Ggml
from exo.worker.engines.mlx.cpu.q8_layers import Q8Linear, Q8ShardedToAllLinear, SwiGluMlp, quantize_model_q8
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.fixtures.model_builder.verify import load_model

MODEL = FIXTURE_MODELS_DIR / "tiny-qwen-tools"


def _logits(model: nn.Module, prompt: list[int], steps: int) -> list[np.ndarray]:
    """Prefill's last logits, then `steps` greedy decode steps' (one row each: the fused MLP's graph)."""
    cache = make_prompt_cache(model)
    logits = cast(mx.array, model(mx.array([prompt]), cache=cache))[:, -1]
    seen = [np.array(logits)]
    for _ in range(steps):
        token = logits.argmax(-1)
        logits = cast(mx.array, model(token[:, None], cache=cache))[:, -1]
        seen.append(np.array(logits))
    return seen


def test_a_tensor_ranks_sharded_layers_are_q8_0_blocks_and_compute_as_the_whole_model(ggml: Ggml) -> None:
    group = mx.distributed.init()
    assert group.size() == 1  # no backend in a test process: each rank's slice is the whole matrix
    whole, rank = load_model(MODEL).model, load_model(MODEL).model
    quantize_model_q8(whole, ggml)
    cast(Callable[[mx.distributed.Group], None], getattr(rank, "shard"))(group)  # noqa: B009 (untyped in mlx-lm)
    quantize_model_q8(rank, ggml)
    for model in (whole, rank):
        model.set_dtype(mx.float32)
    layers = cast(list[nn.Module], rank["model"]["layers"])
    for layer in layers:
        attention, mlp = layer["self_attn"], layer["mlp"]
        assert [type(attention[name]) for name in ("q_proj", "k_proj", "v_proj")] == [Q8Linear] * 3
        assert type(attention["o_proj"]) is Q8ShardedToAllLinear
        assert isinstance(mlp, SwiGluMlp)
        assert [type(mlp[name]) for name in ("gate_proj", "up_proj")] == [Q8Linear] * 2
        assert type(mlp["down_proj"]) is Q8ShardedToAllLinear
        # Nothing of a layer is an mlx matrix any more: its norms and biases are what is left in float32.
        parameters = cast(list[tuple[str, mx.array]], tree_flatten(layer.parameters()))
        assert all(value.ndim == 1 for _, value in parameters), [name for name, value in parameters if value.ndim > 1]
    assert held_bytes(rank) == held_bytes(whole)
    prompt = [(index * 13) % 200 + 5 for index in range(12)]
    for rank_logits, whole_logits in zip(_logits(rank, prompt, 4), _logits(whole, prompt, 4), strict=True):
        np.testing.assert_allclose(rank_logits, whole_logits, rtol=0, atol=1e-5 * float(np.abs(whole_logits).max()))
    # Each decode step's MLP ran as one fused graph, its partial product then summed over the group.
    assert all(1 in cast(SwiGluMlp, layer["mlp"]).graph.kept_row_counts for layer in layers)


def test_a_column_slice_that_does_not_start_and_end_on_a_block_stays_float32(ggml: Ggml) -> None:
    """48 input columns are a block and a half of Q8_0: mlx's own float32 layer keeps serving them."""
    layer = ShardedToAllLinear(48, 64, bias=False, group=mx.distributed.init())
    model = nn.Sequential(layer)
    assert quantize_model_q8(model, ggml) == 0
    assert model.layers[0] is layer
