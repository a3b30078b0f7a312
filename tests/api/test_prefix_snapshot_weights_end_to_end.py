"""The prefix cache's disk tier on a real node with int8 or Q8_0 weights (`--cpu-weights int8` / `q8_0`): the node
writes a snapshot of a long prompt, is restarted and serves the same prompt from it (cached tokens in the usage, the
same greedy answer); restarted with float32 weights it does not use that snapshot, whose identity names the
quantized format. The q8_0 case needs ggml's CPU library (a machine skip without it)."""

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from exo.worker.engines.mlx.cpu.ggml_locate import GGML_DIR_VARIABLE, find_ggml_library, ggml_missing_reason
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.machine_skips import skip_for_machine

MODEL = "tiny-qwen-tools"
SYSTEM_PROMPT = "You are a careful coding agent. Follow the rules of the repository. " * 30
SNAPSHOT_WITHIN_S = 60.0


def _ask(server: ExoServer) -> tuple[str, int]:
    """The greedy answer to the long-system-prompt request, and the cached prompt tokens its usage reports."""
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "Which file holds the tests?"},
        ],
        "max_tokens": 24,
        "temperature": 0,
    }
    answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    completion = cast(dict[str, Any], answer.json())
    cached = completion["usage"]["prompt_tokens_details"]["cached_tokens"]
    return completion["choices"][0]["message"]["content"] or "", cached


def _snapshots(home: Path) -> list[Path]:
    return sorted((home / "prefix-cache").glob("*/*.json"))


def _wait_for_snapshot(home: Path) -> None:
    """Snapshots are written while the runner is idle, after the answer went out."""
    deadline = time.monotonic() + SNAPSHOT_WITHIN_S
    while not _snapshots(home):
        assert time.monotonic() < deadline, "no snapshot was written"
        time.sleep(0.2)


def _disk_cached(server: ExoServer) -> int | None:
    nodes = cast(dict[str, dict[str, Any]], server.state()["nodes"])
    records = [record for node in nodes.values() for record in node["recent_requests"]]
    return records[-1]["disk_cached_tokens"]


@pytest.mark.parametrize("weights", ["int8", "q8_0"])
def test_a_quantized_snapshot_serves_the_restarted_node_and_not_a_float32_one(tmp_path: Path, weights: str) -> None:
    ggml = find_ggml_library()
    if weights == "q8_0" and ggml is None:
        skip_for_machine(ggml_missing_reason())
    home = tmp_path / "home"
    model = [fixture_model(MODEL)]
    # The node's EXO_HOME is a fresh folder without a ggml build: it is told where this process found one.
    env = {"EXO_HOME": str(home), **({GGML_DIR_VARIABLE: str(ggml)} if ggml is not None else {})}

    def node(cpu_weights: str, run: str) -> AbstractContextManager[ExoServer]:
        (tmp_path / run).mkdir()
        return running_exo(model, tmp_path / run, ["--cpu-weights", cpu_weights], env=env)

    with node(weights, "first") as first:
        cold, cold_cached = _ask(first)
        _wait_for_snapshot(home)
    assert cold
    assert cold_cached == 0
    (written,) = _snapshots(home)

    with node(weights, "restarted") as restarted:
        warm, warm_cached = _ask(restarted)
        disk_cached = _disk_cached(restarted)
    assert warm_cached > 200  # the system prompt, read from the snapshot on disk
    assert disk_cached == warm_cached
    assert warm == cold

    with node("float32", "float32") as float32:
        _, float32_cached = _ask(float32)
        float32_disk_cached = _disk_cached(float32)
    assert (float32_cached, float32_disk_cached) == (0, 0)
    assert written.exists()  # still there for a quantized node; the float32 node keeps its own folder
    assert len({path.parent for path in _snapshots(home)}) == 2
