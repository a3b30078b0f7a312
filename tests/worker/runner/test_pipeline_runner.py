"""A model split over 2 and 3 real runner processes answers every kind of request exactly as one runner does.

Rank 0 takes the tasks; the other ranks only follow. Greedy decoding is compared chunk for chunk (tool-call ids
aside) with a whole-model runner: plain text, a streamed tool call, two parallel calls, `tool_choice` required and
named, a `json_schema` answer, and seeded sampling with penalties under a grammar. A second turn reuses every rank's
prefix cache.
"""

from collections.abc import Sequence

import pytest

from exo.shared.types.chunks import Chunk, FinishChunk, PrefillProgressChunk, ToolCallChunk
from exo.shared.types.tasks import GenerationTask, SamplingParams, StructuredOutput, ToolPolicy
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model
from tests.worker.runner.pipelines import (
    DEEP_MODEL,
    WEATHER,
    comparable,
    pipeline_of,
    run_task,
    running_ranks,
    task,
)

ANSWER_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
    "required": ["city", "degrees"],
}


def cases() -> dict[str, GenerationTask]:
    tools = (WEATHER,)
    return {
        "plain text": task("Hello!"),
        "streamed tool call": task("What is the weather in Paris?", tool_policy=ToolPolicy(tools=tools)),
        "two parallel calls": task("What is the weather in Paris and Tokyo?", tool_policy=ToolPolicy(tools=tools)),
        "tool_choice required": task(
            "What is the weather in Paris?", tool_policy=ToolPolicy(tools=tools, mode="required")
        ),
        "tool_choice named": task(
            "Hello!", tool_policy=ToolPolicy(tools=tools, mode="named", callable_tools=("get_weather",))
        ),
        "json_schema": task(
            "What is the weather in Paris?",
            structured_output=StructuredOutput(json_schema=ANSWER_SCHEMA, strict=True),  # pyright: ignore[reportArgumentType]
        ),
        "seeded sampling, penalties, grammar": task(
            "What is the weather in Paris and Tokyo?",
            tool_policy=ToolPolicy(tools=tools, mode="required"),
            sampling=SamplingParams(temperature=1.0, seed=7, repetition_penalty=1.3, max_tokens=64),
        ),
    }


async def _answers(supervisor: RunnerSupervisor, tasks: dict[str, GenerationTask]) -> dict[str, list[Chunk]]:
    return {name: comparable(await run_task(supervisor, chat)) for name, chat in tasks.items()}


def _finish(chunks: Sequence[Chunk]) -> FinishChunk:
    finish = chunks[-1]
    assert isinstance(finish, FinishChunk), chunks
    return finish


@pytest.mark.parametrize("layer_counts", [(3, 1), (1, 2, 1)], ids=["2 ranks", "3 ranks"])
async def test_a_split_model_answers_every_request_as_one_runner_does(layer_counts: tuple[int, ...]) -> None:
    model_path = fixture_model(DEEP_MODEL)
    async with running_ranks(model_path, [ShardAssignment()]) as (whole,):
        expected = await _answers(whole, cases())
    # The cases are what they say: calls where calls are due, the named call, a JSON answer.
    assert sum(isinstance(chunk, ToolCallChunk) for chunk in expected["two parallel calls"]) == 2
    assert _finish(expected["tool_choice named"]).finish_reason == "tool_calls"
    assert _finish(expected["tool_choice required"]).finish_reason == "tool_calls"
    async with running_ranks(model_path, pipeline_of(layer_counts)) as supervisors:
        leader = supervisors[0]
        assert leader.metadata is not None
        assert (leader.metadata.pipeline, leader.metadata.batch_size) == ("mlx-lm", 8)
        split = await _answers(leader, cases())
        for name in expected:
            # Usage included: the ranks' prefix caches hit exactly where the whole runner's cache does.
            assert split[name] == expected[name], name
        # Turn 2: the same conversation again reuses every rank's cached prompt (all but the token that
        # produces the first logits), says so as it starts and ends its prefill, and answers the same.
        again = comparable(await run_task(leader, cases()["streamed tool call"]))
        content = [chunk for chunk in again if not isinstance(chunk, PrefillProgressChunk)]
        expected_content = [
            chunk for chunk in expected["streamed tool call"] if not isinstance(chunk, PrefillProgressChunk)
        ]
        assert content[:-1] == expected_content[:-1]
        usage = _finish(again).usage
        assert usage.cached_tokens == usage.prompt_tokens - 1
        progress = [
            (chunk.done_tokens, chunk.cached_tokens) for chunk in again if isinstance(chunk, PrefillProgressChunk)
        ]
        assert progress == [(usage.cached_tokens, usage.cached_tokens), (usage.prompt_tokens, usage.cached_tokens)]
        assert isinstance(again[0], PrefillProgressChunk)
        assert all(supervisor.status == "ready" for supervisor in supervisors)
