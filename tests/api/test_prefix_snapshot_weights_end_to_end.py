"""The prefix cache's disk tier on a real node with int8 weights (`--cpu-weights int8`): the node writes a snapshot
of a long prompt, is restarted and serves the same prompt from it (cached tokens in the usage, the same greedy
answer); restarted with float32 weights it does not use that snapshot, whose identity names the int8 format."""

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, cast

import httpx

from tests.exo_server import ExoServer, fixture_model, running_exo

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


def test_an_int8_snapshot_serves_the_restarted_int8_node_and_not_a_float32_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    model = [fixture_model(MODEL)]

    def node(cpu_weights: str, run: str) -> AbstractContextManager[ExoServer]:
        (tmp_path / run).mkdir()
        return running_exo(model, tmp_path / run, ["--cpu-weights", cpu_weights], env={"EXO_HOME": str(home)})

    with node("int8", "first") as first:
        cold, cold_cached = _ask(first)
        _wait_for_snapshot(home)
    assert cold
    assert cold_cached == 0
    (written,) = _snapshots(home)

    with node("int8", "restarted") as restarted:
        warm, warm_cached = _ask(restarted)
        disk_cached = _disk_cached(restarted)
    assert warm_cached > 200  # the system prompt, read from the snapshot on disk
    assert disk_cached == warm_cached
    assert warm == cold

    with node("float32", "float32") as float32:
        _, float32_cached = _ask(float32)
        float32_disk_cached = _disk_cached(float32)
    assert (float32_cached, float32_disk_cached) == (0, 0)
    assert written.exists()  # still there for an int8 node; the float32 node keeps its own folder
    assert len({path.parent for path in _snapshots(home)}) == 2
