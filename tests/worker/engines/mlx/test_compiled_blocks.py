"""Compiled blocks (`compiled_blocks.py`): a decode step's decoder layers run their fixed-shape parts as `mx.compile`d
functions. Real forward passes of the qwen2 and llama fixtures, each loaded twice, with the compiled parts and with
`EXO_COMPILED_BLOCKS=off`: the logits, the caches and the runner scheduler's chunks are the same bit for bit, alone
and batched; what the compiled parts do not cover runs mlx-lm's layer; layers they do not fit keep it."""

from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
import pytest
from mlx import nn
from mlx_lm.models import qwen2, qwen3
from mlx_lm.models.cache import BatchKVCache, KVCache

from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx import compiled_blocks
from exo.worker.engines.mlx.compiled_blocks import (
    COMPILED_BLOCKS_VARIABLE,
    MAX_COMPILED_TOKENS,
    compiled_layers,
    install_compiled_blocks,
    remove_compiled_blocks,
    why_not_compiled,
)
from exo.worker.engines.mlx.cpu import kernels
from exo.worker.engines.mlx.cpu.matmul_planner import install_plans
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.generator.scheduling import context_for, run, task
from tests.worker.engines.mlx.generator.test_scheduler import SHAPES

FIXTURES = ("tiny-qwen-tools", "tiny-llama31-tools")
STEPS = 12
FIXTURE_INTERMEDIATE = 128
"""tiny-qwen-tools' MLP width."""


def _layers(model: nn.Module) -> list[nn.Module]:
    return cast(list[nn.Module], cast(Any, model).layers)


def _load(name: str, monkeypatch: pytest.MonkeyPatch, *, compiled: bool) -> LoadedModel:
    with monkeypatch.context() as scoped:
        if compiled:
            scoped.delenv(COMPILED_BLOCKS_VARIABLE, raising=False)
        else:
            scoped.setenv(COMPILED_BLOCKS_VARIABLE, "off")
        return load_model(FIXTURE_MODELS_DIR / name, ShardAssignment())


@pytest.fixture(scope="module", params=FIXTURES)
def pair(request: pytest.FixtureRequest) -> tuple[LoadedModel, LoadedModel]:
    """The fixture loaded with compiled blocks, then without."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        name = cast(str, request.param)
        return _load(name, monkeypatch, compiled=True), _load(name, monkeypatch, compiled=False)


class _Counted:
    """How many times each layer's compiled parts ran (the part before the attention, wrapped)."""

    def __init__(self, model: nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for layer in _layers(model):
            parts = layer.__dict__["_exo_compiled_parts"]
            before = cast(Callable[..., Any], parts.before)

            def counted(*args: Any, before: Callable[..., Any] = before) -> Any:
                self.calls += 1
                return before(*args)

            monkeypatch.setattr(parts, "before", counted)


def _greedy(model: nn.Module, prompts: list[list[int]], steps: int) -> tuple[list[mx.array], list[mx.array]]:
    """A left-padded prefill of `prompts` (one: a plain cache), then `steps` greedy one-token steps: every step's
    logits and the caches' final state."""
    rows = len(prompts)
    longest = max(map(len, prompts))
    padding = [longest - len(prompt) for prompt in prompts]
    caches: list[Any] = [
        BatchKVCache(left_padding=padding) if rows > 1 else KVCache() for _ in range(len(_layers(model)))
    ]
    tokens = mx.array([[0] * pad + prompt for pad, prompt in zip(padding, prompts, strict=True)])
    logits = cast(mx.array, cast(Any, model)(tokens, cache=caches))
    seen = [logits[:, -1]]
    for _ in range(steps):
        tokens = mx.argmax(logits[:, -1], axis=-1)[:, None]
        logits = cast(mx.array, cast(Any, model)(tokens, cache=caches))
        mx.eval(logits)
        seen.append(logits[:, -1])
    state = [array for cache in caches for array in cast(list[mx.array], cache.state)]
    return seen, state


def _equal(first: list[mx.array], second: list[mx.array]) -> bool:
    return len(first) == len(second) and all(mx.array_equal(a, b).item() for a, b in zip(first, second, strict=True))


def test_every_fixture_layer_takes_compiled_parts(pair: tuple[LoadedModel, LoadedModel]) -> None:
    compiled, stock = pair
    assert compiled_layers(compiled.model) == len(_layers(compiled.model)) > 0
    assert compiled_layers(stock.model) == 0


@pytest.mark.parametrize("rows", [1, 3])
def test_decode_steps_give_mlx_lms_bits(
    pair: tuple[LoadedModel, LoadedModel], rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, stock = pair
    prompts = [[11 + 7 * row + index for index in range(5 + 4 * row)] for row in range(rows)]
    counted = _Counted(compiled.model, monkeypatch)
    compiled_logits, compiled_state = _greedy(compiled.model, prompts, STEPS)
    assert counted.calls == (STEPS + 1) * len(_layers(compiled.model))  # every step and the short prompt's pass
    stock_logits, stock_state = _greedy(stock.model, prompts, STEPS)
    assert _equal(compiled_logits, stock_logits)
    assert _equal(compiled_state, stock_state)


def test_a_verification_pass_takes_them_and_a_prefill_piece_does_not(
    pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled, stock = pair
    counted = _Counted(compiled.model, monkeypatch)
    results: list[list[mx.array]] = []
    for model in (compiled.model, stock.model):
        caches: list[Any] = [KVCache() for _ in _layers(model)]
        piece = mx.array([list(range(3, 3 + MAX_COMPILED_TOKENS + 1))])
        prefill = cast(mx.array, cast(Any, model)(piece, cache=caches))
        verify = cast(mx.array, cast(Any, model)(mx.array([[5, 6, 7, 8]]), cache=caches))
        results.append([prefill, verify])
    assert counted.calls == len(_layers(compiled.model))  # the 4-token pass only
    assert _equal(results[0], results[1])


@pytest.mark.parametrize("batched", [False, True])
def test_the_schedulers_chunks_are_the_same(
    pair: tuple[LoadedModel, LoadedModel], batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request shape of the scheduler tests (tool calls, grammars, sampling, penalties, stops), with prompt
    lookup's speculation as shipped: alone, then all admitted together into one batch."""
    compiled, stock = pair
    bodies = [body for name, body in SHAPES.items() if name != "same seed again"]
    outcomes: list[list[list[str]]] = []
    calls: list[int] = []
    for loaded in (compiled, stock):
        counted = _Counted(compiled.model, monkeypatch)
        context = context_for(loaded, DecodeSettings(batch_size=16))
        tasks = [task(body) for body in bodies]
        if batched:
            ran = run(context, {0: tasks})
            outcomes.append([ran[one.task_id].normalised() for one in tasks])
        else:
            outcomes.append([run(context, {0: [one]})[one.task_id].normalised() for one in tasks])
        calls.append(counted.calls)
        monkeypatch.undo()
    assert outcomes[0] == outcomes[1]
    assert calls[0] > 0
    assert calls[1] == 0


@pytest.mark.parametrize(("part", "error"), [("before", ValueError), ("after", RuntimeError)])
def test_a_shape_that_does_not_trace_runs_mlx_lms_operations(
    part: str, error: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either compiled part failing to trace a shape (an evaluation inside): that pass goes on with mlx-lm's own
    operations (the whole layer's where the first part failed; once the cache was updated, the second part's), and the
    shape runs mlx-lm's layer from then on, with the stock layers' logits and caches."""
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=True)
    stock = _load("tiny-qwen-tools", monkeypatch, compiled=False)
    refused: list[int] = []
    for layer in _layers(loaded.model):
        parts = layer.__dict__["_exo_compiled_parts"]

        def refuses(x: mx.array, _other: mx.array) -> Any:
            refused.append(x.shape[1])
            raise error("an evaluation inside a traced function")

        monkeypatch.setattr(parts, part, refuses)
    prompts = [[4, 5, 6, 7]]
    got, got_state = _greedy(loaded.model, prompts, 3)
    expected, expected_state = _greedy(stock.model, prompts, 3)
    assert _equal(got, expected)
    assert _equal(got_state, expected_state)
    layers = len(_layers(loaded.model))
    # Each shape tried once a layer (the prompt's, then a step's), then remembered.
    assert refused == [4] * layers + [1] * layers


def test_layers_with_a_replaced_module_are_left_as_mlx_lm_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=False)
    layer = _layers(loaded.model)[1]
    projection = cast(Any, layer).mlp.up_proj
    cast(Any, layer).mlp.up_proj = type("OwnLinear", (nn.Linear,), {})(*reversed(projection.weight.shape))
    assert why_not_compiled(layer) == "its up_proj is a OwnLinear"
    assert install_compiled_blocks(loaded.model, {}) == "compiled blocks off (layer 1: its up_proj is a OwnLinear)"
    assert compiled_layers(loaded.model) == 0


def test_the_check_at_load_refuses_other_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=False)
    original = compiled_blocks._CompiledParts.__init__  # pyright: ignore[reportPrivateUsage]

    def off_by_a_little(parts: Any, layer: nn.Module) -> None:
        original(parts, layer)
        after = parts.after
        parts.after = lambda x, attended: after(x, attended) * (1 + 1e-6)

    monkeypatch.setattr(compiled_blocks._CompiledParts, "__init__", off_by_a_little)  # pyright: ignore[reportPrivateUsage]
    said = install_compiled_blocks(loaded.model, {})
    assert said == "compiled blocks off (their check at load found other bits than mlx-lm's layer)"
    assert compiled_layers(loaded.model) == 0
    assert all(why_not_compiled(layer) is None for layer in _layers(loaded.model))  # mlx-lm's own class again


def test_the_variable_turns_them_off_and_a_matmul_plan_removes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compiled_layers(_load("tiny-qwen-tools", monkeypatch, compiled=False).model) == 0
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=True)
    assert compiled_layers(loaded.model) > 0
    install_plans(loaded.model, {})  # planned layers decide per call: traced parts would not see them
    assert compiled_layers(loaded.model) == 0
    assert remove_compiled_blocks(loaded.model) == 0


def test_a_model_without_layers_is_left_alone() -> None:
    said = install_compiled_blocks(nn.Linear(2, 2), {})
    assert said == "compiled blocks off (the model has no list of decoder layers)"


def test_a_layer_another_engine_replaced_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=False)
    layer = _layers(loaded.model)[0]
    layer.__class__ = type("TransformerBlock", (type(layer),), {})
    assert why_not_compiled(layer) == "its class is replaced (another engine runs its steps)"


def _tiny_qwen3() -> nn.Module:
    """A Qwen 3 model in mlx-lm's own classes with random weights (no fixture of this architecture is trained)."""
    mx.random.seed(3)
    arguments = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=300,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    )
    model = qwen3.Model(arguments)
    for layer in _layers(model):  # head norms other than ones, so that leaving them out would show
        attention = cast(Any, layer).self_attn
        attention.q_norm.weight = mx.random.uniform(0.5, 1.5, attention.q_norm.weight.shape)
        attention.k_norm.weight = mx.random.uniform(0.5, 1.5, attention.k_norm.weight.shape)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("rows", [1, 3])
def test_qwen3_layers_with_head_norms_give_mlx_lms_bits(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny_qwen3()
    assert install_compiled_blocks(model, {}).startswith("compiled blocks: 2 decoder layers")
    prompts = [[11 + 7 * row + index for index in range(5 + 4 * row)] for row in range(rows)]
    counted = _Counted(model, monkeypatch)
    compiled_logits, compiled_state = _greedy(model, prompts, STEPS)
    assert counted.calls == (STEPS + 1) * 2
    assert remove_compiled_blocks(model) == 2
    stock_logits, stock_state = _greedy(model, prompts, STEPS)
    assert _equal(compiled_logits, stock_logits)
    assert _equal(compiled_state, stock_state)


def test_a_qwen3_layer_with_a_replaced_head_norm_is_left_alone() -> None:
    model = _tiny_qwen3()
    attention = cast(Any, _layers(model)[0]).self_attn
    attention.k_norm = nn.LayerNorm(16)
    assert install_compiled_blocks(model, {}) == "compiled blocks off (layer 0: its k_norm is a LayerNorm)"


def test_a_check_at_load_that_fails_leaves_the_layers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=False)
    original = compiled_blocks._CompiledParts.__init__  # pyright: ignore[reportPrivateUsage]

    def broken(parts: Any, layer: nn.Module) -> None:
        original(parts, layer)

        def fails(_x: mx.array, _offset: mx.array) -> Any:
            raise TypeError("a backend that cannot compile this")

        parts.before = fails

    monkeypatch.setattr(compiled_blocks._CompiledParts, "__init__", broken)  # pyright: ignore[reportPrivateUsage]
    said = install_compiled_blocks(loaded.model, {})
    assert said == "compiled blocks off (their check at load failed: TypeError: a backend that cannot compile this)"
    assert compiled_layers(loaded.model) == 0


def test_the_cpu_engines_numpy_swiglu_is_not_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CPU engine's numpy SwiGLU takes a pass (it evaluates its inputs, which a traced function cannot),
    the compiled part after the attention gives way to mlx-lm's operations: the same logits as the stock layers. Its
    bound is lowered so that the fixture's 4-token prompt crosses it and a step's single token does not."""
    monkeypatch.setattr(qwen2, "swiglu", kernels.swiglu)  # as the CPU engine points it for float32 weights
    monkeypatch.setattr(kernels, "MIN_GATE_VALUES", 4 * FIXTURE_INTERMEDIATE)
    loaded = _load("tiny-qwen-tools", monkeypatch, compiled=True)
    stock = _load("tiny-qwen-tools", monkeypatch, compiled=False)
    counted = _Counted(loaded.model, monkeypatch)
    prompts = [[4, 5, 6, 7]]
    got, got_state = _greedy(loaded.model, prompts, 3)
    expected, expected_state = _greedy(stock.model, prompts, 3)
    assert _equal(got, expected)
    assert _equal(got_state, expected_state)
    for layer in _layers(loaded.model):
        assert layer.__dict__["_exo_compiled_parts"].untraceable == {((1, 4, 64), ())}
    assert counted.calls == 4 * len(_layers(loaded.model))  # the prompt's pass and three steps
