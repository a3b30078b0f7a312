"""Loading a model builds llguidance's tokenizer, so the first constrained request after the load builds nothing."""

from exo.shared.types.common import ModelId, new_command_id, new_task_id
from exo.shared.types.tasks import GenerationParams, GenerationTask, PromptMessage, SamplingParams, ToolPolicy
from exo.shared.types.worker.runner_response import RunnerBootstrap
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.constrained.compiled import guidance_tokenizer
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.runner.runner import _load  # pyright: ignore[reportPrivateUsage] -- the load step under test
from tests.exo_server import fixture_model
from tests.worker.runner.pipelines import WEATHER

MODEL = ModelId("tiny-qwen-tools")


def test_the_first_constrained_request_after_a_load_builds_no_llguidance_tokenizer() -> None:
    before = guidance_tokenizer.cache_info().misses
    bootstrap = RunnerBootstrap(model_path=str(fixture_model(MODEL)), shard=ShardAssignment())
    context, _, link = _load(bootstrap, lambda _description: None)
    assert link is None
    assert guidance_tokenizer.cache_info().misses == before + 1, "the load built the model's llguidance tokenizer"

    required = GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=MODEL,
        params=GenerationParams(
            messages=(PromptMessage(role="user", content="What is the weather in Paris?"),),
            tool_policy=ToolPolicy(tools=(WEATHER,), mode="required"),
            sampling=SamplingParams(max_tokens=16),
        ),
    )
    hits = guidance_tokenizer.cache_info().hits
    request = ChatRequest.open(context, required)
    assert not request.processors.empty, "tool_choice required runs under a grammar"
    assert guidance_tokenizer.cache_info().misses == before + 1, "the request built a second llguidance tokenizer"
    assert guidance_tokenizer.cache_info().hits > hits, "the request used the tokenizer the load built"
