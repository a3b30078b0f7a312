"""A model split by its matrices (tensor parallel) over 2 real runner processes answers every kind of request
exactly as one runner does.

Each rank holds half of every layer's attention heads, KV heads and MLP columns (mlx-lm's `shard`); rank 0 takes the
tasks, chooses every token and parses the tool calls, and the other rank feeds the tokens rank 0 sends it. Greedy
decoding is compared chunk for chunk (tool-call ids aside) with a whole-model runner, on the Qwen2 fixture (every
kind of answer) and the Llama 3.1 one (its own tool-call formats).
"""

from collections.abc import Callable

import pytest

from exo.shared.types.chunks import Chunk, ToolCallChunk
from exo.shared.types.tasks import GenerationTask, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import GET_TIME_TOOL
from tests.worker.runner.pipelines import WEATHER, comparable, run_task, running_ranks, task, tensor_split_of
from tests.worker.runner.test_pipeline_runner import cases

TIME = ToolSpec.model_validate(GET_TIME_TOOL["function"])


def _llama_cases() -> dict[str, GenerationTask]:
    tools = ToolPolicy(tools=(WEATHER, TIME))
    return {
        "plain text": task("Hello!", tool_policy=tools),
        "streamed tool call": task("What is the weather in Paris?", tool_policy=tools),
        "bare JSON call": task("What time is it in Tokyo?", tool_policy=tools),
    }


MODELS: dict[str, tuple[int, Callable[[], dict[str, GenerationTask]]]] = {
    "tiny-qwen-tools-deep": (4, cases),
    "tiny-llama31-tools": (2, _llama_cases),
}


async def _answers(supervisor: RunnerSupervisor, tasks: dict[str, GenerationTask]) -> dict[str, list[Chunk]]:
    return {name: comparable(await run_task(supervisor, chat)) for name, chat in tasks.items()}


@pytest.mark.parametrize("model", list(MODELS))
async def test_a_tensor_split_answers_every_request_as_one_runner_does(model: str) -> None:
    model_path = fixture_model(model)
    num_layers, make_cases = MODELS[model]
    async with running_ranks(model_path, [ShardAssignment()]) as (whole,):
        expected = await _answers(whole, make_cases())
        assert whole.metadata is not None
        whole_bytes = whole.metadata.weights_bytes
    # The cases are what they say: a tool call where one is due.
    assert any(isinstance(chunk, ToolCallChunk) for chunk in expected["streamed tool call"])
    async with running_ranks(model_path, tensor_split_of(2, num_layers)) as supervisors:
        leader = supervisors[0]
        assert leader.metadata is not None
        assert leader.metadata.pipeline == "tensor"
        # Each rank holds the embeddings whole and half of every layer.
        assert whole_bytes is not None
        assert leader.metadata.weights_bytes is not None
        assert leader.metadata.weights_bytes < whole_bytes
        split = await _answers(leader, make_cases())
        for name in expected:
            # Usage included: each rank's prefix cache holds its own heads and hits where the whole runner's does.
            assert split[name] == expected[name], name
        assert all(supervisor.status == "ready" for supervisor in supervisors)
