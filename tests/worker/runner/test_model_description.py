"""A runner describes its model (context length, tool format, reasoning, checkpoint) from its tokenizer and files
before the weights load, and the description is what the loaded runner then reports."""

import anyio
import pytest

from exo.shared.types.common import ModelId, new_runner_id
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.runner_response import ModelDescription, RunnerBootstrap
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.runner import _load  # pyright: ignore[reportPrivateUsage] -- the load step under test
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model
from tests.worker.runner.tasks import until_ready

DESCRIBED_FIELDS = set(ModelDescription.model_fields)


@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_the_description_agrees_with_what_the_loaded_runner_reports(name: str) -> None:
    described: list[ModelDescription] = []
    bootstrap = RunnerBootstrap(model_path=str(fixture_model(ModelId(name))), shard=ShardAssignment())
    context, metadata, _ = _load(bootstrap, described.append)
    assert len(described) == 1
    description = described[0]
    assert description == ModelDescription.model_validate(metadata.model_dump(include=DESCRIBED_FIELDS))
    assert description.tool_format == str(context.tool_format)
    assert description.checkpoint is not None
    assert description.checkpoint.parameter_count > 0


async def test_a_loading_runner_shows_its_description_before_it_is_ready() -> None:
    """The supervisor (what the worker publishes in /state) holds the description while the runner still loads."""
    seen: list[tuple[str, ModelDescription | None, bool]] = []
    config = RunnerConfig(
        model_id=ModelId("tiny-qwen-tools"),
        model_path=fixture_model(ModelId("tiny-qwen-tools")),
        decode=DecodeSettings(),
    )
    supervisor = RunnerSupervisor(
        new_runner_id(),
        config,
        on_change=lambda: seen.append((supervisor.status, supervisor.description, supervisor.metadata is not None)),
    )
    async with anyio.create_task_group() as group:
        group.start_soon(supervisor.run)
        with anyio.fail_after(120):
            await until_ready(supervisor)
        await supervisor.stop()
        group.cancel_scope.cancel()
    loading = [description for status, description, loaded in seen if status == "loading" and not loaded]
    described = [description for description in loading if description is not None]
    assert described, f"no description while loading; saw {seen}"
    assert supervisor.metadata is not None
    assert described[0].tool_format == supervisor.metadata.tool_format
    assert described[0].context_length == supervisor.metadata.context_length
