"""A node stopped cleanly (SIGTERM) right after a long prompt's answer has its prompt snapshot on disk when it starts
again: the restarted node serves the prompt from the disk tier and reports the cached tokens."""

import signal
from pathlib import Path

import httpx
import pytest

from tests.exo_server import fixture_model, running_exo

pytestmark = pytest.mark.slow  # both tests start real nodes

MODEL = "tiny-qwen-tools"
LONG_PROMPT = " ".join(f"item{index % 97} is filed under shelf {index % 13}." for index in range(150))


def _ask(base_url: str, question: str) -> dict[str, object]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": LONG_PROMPT}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
    }
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    usage: dict[str, object] = response.json()["usage"]
    return usage


def test_a_long_prompt_answered_just_before_sigterm_is_served_from_disk_after_the_restart(tmp_path: Path) -> None:
    home = {"EXO_HOME": str(tmp_path / "home")}
    with running_exo([fixture_model(MODEL)], tmp_path, env=home) as node:
        first = _ask(node.base_url, "Where is item5?")
        node.process.send_signal(signal.SIGTERM)
        node.process.wait(timeout=60)
        log = node.log()
    prompt_tokens = first["prompt_tokens"]
    assert isinstance(prompt_tokens, int)
    assert prompt_tokens > 1_000
    assert "Traceback" not in log
    snapshots = list((tmp_path / "home" / "prefix-cache").rglob("*.safetensors"))
    assert snapshots
    assert not any(path.name.endswith(".partial.safetensors") for path in snapshots), snapshots

    with running_exo([fixture_model(MODEL)], tmp_path, env=home) as restarted:
        again = _ask(restarted.base_url, "Where is item7?")
    details = again["prompt_tokens_details"]
    assert isinstance(details, dict)
    cached = details["cached_tokens"]  # pyright: ignore[reportUnknownVariableType]
    assert isinstance(cached, int)
    assert cached > prompt_tokens // 2, again


def test_a_snapshot_replaced_by_a_directory_costs_a_prefill_on_a_real_node_not_a_500(tmp_path: Path) -> None:
    home = {"EXO_HOME": str(tmp_path / "home")}
    with running_exo([fixture_model(MODEL)], tmp_path, env=home) as node:
        _ask(node.base_url, "Where is item5?")
    (snapshot,) = (tmp_path / "home" / "prefix-cache").rglob("*.safetensors")
    snapshot.unlink()
    snapshot.mkdir()
    (snapshot / "inside").write_text("not a snapshot")

    cached: list[object] = []
    for _ in range(2):  # on main 0b66627 every restart failed every request sharing the prefix
        with running_exo([fixture_model(MODEL)], tmp_path, env=home) as restarted:
            usage = _ask(restarted.base_url, "Where is item7?")
        details = usage["prompt_tokens_details"]
        assert isinstance(details, dict)
        cached.append(details["cached_tokens"])  # pyright: ignore[reportUnknownArgumentType]
        assert not snapshot.is_dir()
    assert cached[0] == 0
    assert isinstance(cached[1], int)
    assert cached[1] > 0, "the second restart reads the snapshot the first one wrote"
