"""A tensor split under `--cpu-weights q8_0` or `gguf` (2 real runner processes) holds its sharded matrices as ggml
blocks of its own slice and answers as one runner under the same setting does.

Each rank's slices are the whole model's blocks (a row range, or a column range starting on a block: the fixture's
widths split into whole Q8_0 blocks, and its GGUF export's o_proj and down_proj are F16 and BF16, one value a block),
so the ranks' partial products, summed over the ring, differ from the whole product only by float32 rounding:
greedy tokens and tool calls are compared chunk for chunk. Each rank's weights are what placement plans for such a
tensor rank (the shared weights whole, half of every layer in its blocks), far under what it plans in float32.

Needs ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it the test skips for a reason of the
machine, a failure under EXO_STRICT_SKIPS=1.
"""

from pathlib import Path

import pytest

from exo.models.footprint import read_footprint
from exo.shared.types.chunks import ToolCallChunk
from exo.shared.types.cpu_kernels import CpuWeights
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import FixtureModelName
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu.gguf_export import export_fixture
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu
from tests.worker.runner.pipelines import comparable, run_task, running_ranks, tensor_split_of
from tests.worker.runner.test_pipeline_runner import cases

pytestmark = pytest.mark.slow

MODELS: dict[CpuWeights, tuple[FixtureModelName, int]] = {
    "q8_0": ("tiny-qwen-tools-deep", 4),
    "gguf": ("tiny-qwen-tools", 2),  # the GGUF export reads one safetensors file; the deep model has several
}
"""Each setting's fixture model and its layer count."""
CASES = ("plain text", "streamed tool call", "two parallel calls", "json_schema")
SHARE_OF_FLOAT32: dict[CpuWeights, float] = {"q8_0": 1 / 3, "gguf": 1 / 2}
"""The most a rank may hold of what a float32 rank is planned: Q8_0 is 34 bytes per 128 of float32; the GGUF export
keeps o_proj and down_proj in 16 bits."""


@pytest.mark.parametrize("weights", list(SHARE_OF_FLOAT32))
async def test_a_tensor_split_holds_its_slices_in_ggml_blocks_and_answers_as_one_runner(
    weights: CpuWeights, tmp_path: Path
) -> None:
    require_linux_cpu()
    if find_ggml_library() is None:
        skip_for_machine(ggml_missing_reason())
    model, layers = MODELS[weights]
    model_path = fixture_model(model) if weights == "q8_0" else export_fixture(model, tmp_path / model)
    tasks = {name: chat for name, chat in cases().items() if name in CASES}
    async with running_ranks(model_path, [ShardAssignment()], cpu_weights=weights) as (whole,):
        assert whole.metadata is not None
        assert whole.metadata.dtype == weights
        expected = {name: comparable(await run_task(whole, chat)) for name, chat in tasks.items()}
    assert any(isinstance(chunk, ToolCallChunk) for chunk in expected["streamed tool call"])
    footprint = read_footprint(model_path)
    planned, planned_float32 = (footprint.tensor_rank_bytes(2, weights=held) for held in (weights, "float32"))
    async with running_ranks(model_path, tensor_split_of(2, layers), cpu_weights=weights) as supervisors:
        for supervisor in supervisors:
            assert supervisor.metadata is not None
            assert supervisor.metadata.pipeline == "tensor"
            assert supervisor.metadata.dtype == weights
            held = supervisor.metadata.weights_bytes
            assert held is not None
            # Float32 sharded matrices would hold about 3x the plan; the norms and biases kept in float32 are a
            # few hundredths of this small model.
            assert planned * 0.9 <= held <= planned * 1.1, (held, planned)
            assert held < planned_float32 * SHARE_OF_FLOAT32[weights], (held, planned_float32)
        leader = supervisors[0]
        for name, chat in tasks.items():
            assert comparable(await run_task(leader, chat)) == expected[name], name
        assert all(supervisor.status == "ready" for supervisor in supervisors)
