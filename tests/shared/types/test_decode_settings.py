"""The decode settings cross the pipe to a runner whole: speculation's settings or its absence included."""

import pytest

from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.shared.types.worker.runner_response import RunnerBootstrap, RunnerRequestAdapter
from exo.shared.types.worker.shards import ShardAssignment


@pytest.mark.parametrize(
    "decode",
    [
        DecodeSettings(),
        DecodeSettings(batch_size=2, speculation=LookupSettings(adaptive=False), loop_guard="warn"),
        DecodeSettings(speculation=None, auto_tool_grammar=False, tool_call_repair=False, matmul_plan=False),
    ],
)
def test_the_decode_settings_cross_to_the_runner_unchanged(decode: DecodeSettings) -> None:
    bootstrap = RunnerBootstrap(model_path="/m", shard=ShardAssignment(), decode=decode)
    crossed = RunnerRequestAdapter.validate_json(RunnerRequestAdapter.dump_json(bootstrap))
    assert isinstance(crossed, RunnerBootstrap)
    assert crossed.decode == decode


def test_speculation_on_or_off_from_the_command_line_reads_as_the_default_settings_or_none() -> None:
    assert DecodeSettings.model_validate({"speculation": True}).speculation == LookupSettings()
    assert DecodeSettings.model_validate({"speculation": False}).speculation is None
