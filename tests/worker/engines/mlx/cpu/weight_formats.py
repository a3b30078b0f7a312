"""What the int8 and Q8_0 weight-format tests share: the error measure, a real trained matrix, and the check that a
fixture model loaded in a format answers its trained prompts exactly."""

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from exo.shared.types.cpu_kernels import CpuWeightsSetting
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.client_requests import CLAUDE_CODE_CASES, CODEX_CASES, OPENCODE_MCP_CASES
from tests.fixtures.fixture_specs import (
    AGENT_CASES,
    FIXTURE_MODELS_DIR,
    LLAMA31_TOOLS_CASES,
    QWEN_TOOLS_CASES,
    FixtureCase,
    FixtureModelName,
)
from tests.fixtures.model_builder.verify import LoadedModel, greedy_generate, load_model
from tests.worker.engines.mlx.cpu.gguf_export import export_fixture, export_untied

# Every fixture model with the table it was trained on (tiny-qwen-tools-deep is tiny-qwen-tools' table on a deeper
# model split into five files; tiny-qwen-mcp and tiny-qwen-codex are trained on captured client requests).
TABLES: dict[FixtureModelName, tuple[FixtureCase, ...]] = {
    "tiny-qwen-tools": QWEN_TOOLS_CASES,
    "tiny-llama31-tools": LLAMA31_TOOLS_CASES,
    "tiny-qwen-agent": AGENT_CASES,
    "tiny-qwen-tools-deep": QWEN_TOOLS_CASES,
    "tiny-qwen-claude-code": CLAUDE_CODE_CASES,
    "tiny-qwen-mcp": OPENCODE_MCP_CASES,
    "tiny-qwen-codex": CODEX_CASES,
}


def relative_error(result: mx.array, reference: mx.array) -> float:
    difference, scale = np.asarray(result - reference), np.asarray(reference)
    return float(np.abs(difference).max() / np.abs(scale).max())


def fixture_matrix() -> mx.array:
    """A real trained weight matrix (the MLP's down projection of tiny-qwen-tools, 64 x 256)."""
    model = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools").model
    parameters = dict(cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())))
    return parameters["model.layers.0.mlp.down_proj.weight"].astype(mx.float32)


def loaded_fixture(name: FixtureModelName, weights: CpuWeightsSetting, directory: Path | None = None) -> LoadedModel:
    """Fixture model `name` loaded the way a runner loads it under `--cpu-weights <weights>` (its dtype asserted),
    from `directory` where given (a copy of the fixture, such as one imported from a GGUF export)."""
    loaded = exo_load_model(
        directory or FIXTURE_MODELS_DIR / name, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights=weights)
    )
    assert loaded.dtype == weights, loaded.dtype
    return load_model(FIXTURE_MODELS_DIR / name).model_copy(update={"model": loaded.model})


def mismatched_trained_cases(
    name: FixtureModelName, weights: CpuWeightsSetting, directory: Path | None = None
) -> list[str]:
    """The names of `name`'s trained cases whose greedy output (tool calls included), loaded as a runner loads it
    under `--cpu-weights <weights>` (from `directory` where given), is not exactly the trained output."""
    fixture = loaded_fixture(name, weights, directory)
    mismatched: list[str] = []
    for case in TABLES[name]:
        output = greedy_generate(fixture, case.messages, case.tools)
        if (output.text, output.stop_token) != (case.expected_text, case.expected_stop):
            mismatched.append(case.name)
    return mismatched


def greedy_step_logits(model: nn.Module, tokens: mx.array, steps: int) -> list[np.ndarray]:
    """The logits of a prefill of `tokens` (one row a sequence) then of `steps` greedy decode steps, each evaluated."""
    cache = make_prompt_cache(model)
    outputs: list[np.ndarray] = []
    for _ in range(steps + 1):
        logits = model(tokens, cache=cache)
        mx.eval(logits)
        outputs.append(np.array(logits))
        tokens = logits[:, -1].argmax(-1)[:, None]
    return outputs


def graph_and_plain(
    name: FixtureModelName,
    weights: CpuWeightsSetting,
    monkeypatch: pytest.MonkeyPatch,
    directory: Path,
    off: Sequence[str],
    *,
    untied: bool = False,
) -> tuple[nn.Module, nn.Module]:
    """The fixture as the engine loads it, and loaded again with each variable of `off` set to `off` (the ggml
    graphs they name left out); under `gguf`, both from its export to a GGUF in `directory` (several block types;
    `untied`: with an output head of its own, `export_untied`)."""
    export = export_untied if untied else export_fixture
    source = export(name, directory / name) if weights == "gguf" else None
    graph = loaded_fixture(name, weights, source).model
    with monkeypatch.context() as switched:
        for variable in off:
            switched.setenv(variable, "off")
        plain = loaded_fixture(name, weights, source).model
    return graph, plain


def assert_within_product_rounding(a: np.ndarray, b: np.ndarray) -> None:
    """Two ggml paths' outputs agree within what quantizing each product's input adds: both quantize it to the
    blocks' dot-product format, and norms, rope and softmax computed apart round apart, which can move a quantized
    input by one step."""
    assert float(np.abs(a - b).max()) < 5e-2 * float(np.abs(b).max())
