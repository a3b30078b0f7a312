"""The API process never loads MLX: the model runs in the runner subprocess, and the API must stay light and keep
answering whatever the runner does. Checked on a real node through the libraries its process has mapped."""

import sys
from pathlib import Path

import pytest

from tests.exo_server import fixture_model, running_exo

QWEN = "tiny-qwen-tools"


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process's memory map from /proc")
def test_the_api_process_has_no_mlx_library_mapped(tmp_path: Path) -> None:
    with running_exo([fixture_model(QWEN)], tmp_path) as server:
        reply = server.openai_client().chat.completions.create(
            model=QWEN, messages=[{"role": "user", "content": "Hello!"}], max_tokens=4
        )
        assert reply.choices
        maps = Path(f"/proc/{server.process.pid}/maps").read_text()
        runner_pid = server.runner()["pid"]
        assert isinstance(runner_pid, int)
        runner_maps = Path(f"/proc/{runner_pid}/maps").read_text()
    assert "libmlx" in runner_maps, "the probe must see MLX where it is loaded"
    assert "libmlx" not in maps
