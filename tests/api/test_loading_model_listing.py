"""A model whose runner is still loading is listed as it will be once loaded (tool use, reasoning, context length),
from what the runner read of its files before its weights: clients that read /v1/models or Ollama's /api/show at
start-up (VS Code Copilot offers agent mode from `tools`) see the model's capabilities during a long load."""

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from exo.shared.types.preparation import ModelPreparation, PreparationPhase
from exo.shared.types.state import RunnerInfo
from exo.shared.types.worker.runner_response import CheckpointFacts, ModelDescription
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_NODE, ScriptedMaster, scripted_app

DESCRIPTION = ModelDescription(
    context_length=32768,
    tool_format="hermes",
    supports_reasoning=True,
    vocab_size=741,
    checkpoint=CheckpointFacts(
        family="qwen2", parameter_count=494_000_000, file_bytes=988_000_000, quantization="BF16"
    ),
)


def _loading(master: ScriptedMaster, description: ModelDescription | None) -> None:
    """The scripted model's one runner, still loading, having described its model (or not yet)."""
    runners: dict[Any, RunnerInfo] = {
        runner_id: runner.model_copy(update={"status": "loading", "metadata": None, "description": description})
        for runner_id, runner in master.state.runners.items()
    }
    master.state = master.state.model_copy(update={"runners": runners})


@pytest.fixture
def app() -> Iterator[tuple[TestClient, ScriptedMaster]]:
    application, master = scripted_app()
    with TestClient(application) as client:
        yield client, master


def _card(client: TestClient) -> dict[str, Any]:
    answer = client.get("/v1/models")
    assert answer.status_code == 200
    cards = [card for card in answer.json()["data"] if card["id"] == SCRIPTED_MODEL]
    assert len(cards) == 1
    return cards[0]


def test_a_loading_model_that_described_itself_lists_its_capabilities(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = app
    _loading(master, DESCRIPTION)
    card = _card(client)
    assert card["capabilities"] == ["chat", "tool_use", "reasoning"]
    assert card["context_length"] == 32768
    assert card["vocab_size"] == 741
    shown = client.post("/api/show", json={"model": SCRIPTED_MODEL})
    assert shown.status_code == 200
    body = shown.json()
    assert body["capabilities"] == ["completion", "tools", "thinking"]
    assert body["model_info"]["qwen2.context_length"] == 32768
    assert body["model_info"]["general.parameter_count"] == 494_000_000
    assert body["details"]["family"] == "qwen2"


def test_a_loading_model_not_yet_described_claims_nothing_it_does_not_know(
    app: tuple[TestClient, ScriptedMaster],
) -> None:
    client, master = app
    _loading(master, None)
    card = _card(client)
    assert card["capabilities"] == ["chat"]
    assert card["context_length"] is None
    shown = client.post("/api/show", json={"model": SCRIPTED_MODEL}).json()
    assert shown["capabilities"] == ["completion"]


def test_a_request_sent_while_the_model_loads_is_checked_against_its_description(
    app: tuple[TestClient, ScriptedMaster],
) -> None:
    """top_k at or above the vocabulary gets its 400 during the load too, not only once the model is loaded."""
    client, master = app
    _loading(master, DESCRIPTION)
    body = {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "Hello!"}], "top_k": 741}
    refused = client.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400
    assert "vocabulary size of 741" in refused.json()["error"]["message"]
    assert master.tasks == []


def test_a_model_whose_runner_refused_to_load_is_listed_as_failed_with_the_reason(
    app: tuple[TestClient, ScriptedMaster],
) -> None:
    """A load the runner refused (no ggml library, no kept GGUF...) stays listed, from what the runner read before
    its weights, but says so: `status` failed and `error` the runner's reason, which names what to do."""
    client, master = app
    reason = "--cpu-weights q8_0 needs ggml's CPU library: build it with `uv run exo ggml build`"
    runners: dict[Any, RunnerInfo] = {
        runner_id: runner.model_copy(
            update={"status": "failed", "metadata": None, "description": DESCRIPTION, "last_error": reason}
        )
        for runner_id, runner in master.state.runners.items()
    }
    master.state = master.state.model_copy(update={"runners": runners})
    card = _card(client)
    assert card["status"] == "failed"
    assert card["error"] == reason
    assert card["capabilities"] == ["chat", "tool_use", "reasoning"]


def test_a_loaded_model_is_listed_ready_without_an_error(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, _ = app
    card = _card(client)
    assert card["status"] in ("ready", "running")
    assert card["error"] is None


def _in_preparation(master: ScriptedMaster, phase: PreparationPhase, done_bytes: int) -> None:
    """The scripted model being converted on its node (`phase` at `done_bytes` of 400 MB) and no runner yet."""
    preparation = ModelPreparation(
        model_id=SCRIPTED_MODEL, phase=phase, done_bytes=done_bytes, total_bytes=400_000_000, started_at=0, updated_at=1
    )
    node = master.state.nodes[SCRIPTED_NODE]
    node = node.model_copy(update={"preparations": {SCRIPTED_MODEL: preparation}})
    master.state = master.state.model_copy(update={"nodes": {SCRIPTED_NODE: node}, "runners": {}})


def test_a_model_being_prepared_is_listed_with_its_progress_before_any_runner(
    app: tuple[TestClient, ScriptedMaster],
) -> None:
    """Right after `exo` starts, a first run downloads or converts the default model for a minute or more: a client
    listing the models then (opencode, `exo launch`) finds the model it will be served, marked preparing."""
    client, master = app
    _in_preparation(master, "converting", 100_000_000)
    card = _card(client)
    assert card["status"] == "preparing"
    assert card["preparation"]["phase"] == "converting"
    assert card["preparation"]["done_bytes"] == 100_000_000
    assert card["capabilities"] == ["chat"]
    assert card["context_length"] is None


def test_an_ended_preparation_lists_nothing_by_itself(app: tuple[TestClient, ScriptedMaster]) -> None:
    """A preparation that failed leaves a failed runner (listed as such) and a finished one a runner: neither is
    listed again as preparing."""
    client, master = app
    _in_preparation(master, "ready", 400_000_000)
    assert client.get("/v1/models").json()["data"] == []


def test_a_served_model_is_listed_by_its_runner_while_another_node_prepares_it(
    app: tuple[TestClient, ScriptedMaster],
) -> None:
    client, master = app
    runners = master.state.runners
    _in_preparation(master, "downloading", 1)
    master.state = master.state.model_copy(update={"runners": runners})
    card = _card(client)
    assert card["status"] in ("ready", "running")
    assert card["preparation"] is None
