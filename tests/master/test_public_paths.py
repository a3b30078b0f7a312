"""Model paths stay out of API answers (/state, error messages, streamed or not) unless the operator asks."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exo.master.public_paths import PathHider, storage_directories
from exo.node import NodeConfig
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import ModelId, RunnerId
from exo.shared.types.state import RunnerInfo, State
from exo.shared.types.worker.shards import ShardAssignment
from tests.master.inprocess_app import SCRIPTED_MODEL, ScriptedWorker, scripted_app

MODEL_PATH = "/nonexistent/scripted-model"  # where inprocess_app says the scripted model lives
HELLO = {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
LOAD_FAILURE = f"generation failed: OSError: cannot read {MODEL_PATH}/model.safetensors"


@pytest.fixture
def hidden() -> Iterator[tuple[TestClient, ScriptedWorker]]:
    application, worker = scripted_app()
    with TestClient(application) as client:
        yield client, worker


def test_state_shows_the_model_not_where_it_lives(hidden: tuple[TestClient, ScriptedWorker]) -> None:
    client, _ = hidden
    state = client.get("/state")
    assert MODEL_PATH not in state.text
    (runner,) = state.json()["runners"].values()
    assert runner["model_path"] == f"<{SCRIPTED_MODEL}>"


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_task_does_not_show_the_model_path(hidden: tuple[TestClient, ScriptedWorker], stream: bool) -> None:
    client, worker = hidden
    worker.script = (ErrorChunk(error="generation_failed", message=LOAD_FAILURE),)
    response = client.post("/v1/chat/completions", json={**HELLO, "stream": stream})
    assert MODEL_PATH not in response.text
    assert f"cannot read <{SCRIPTED_MODEL}>/model.safetensors" in response.text


def test_an_error_mid_stream_does_not_show_the_model_path(hidden: tuple[TestClient, ScriptedWorker]) -> None:
    client, worker = hidden
    worker.script = (TokenChunk(text="Hi"), ErrorChunk(error="generation_failed", message=LOAD_FAILURE))
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
        body = (
            {**HELLO, "stream": True, "max_tokens": 5}
            if path != "/v1/responses"
            else {"model": SCRIPTED_MODEL, "input": "Hello!", "stream": True}
        )
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        assert MODEL_PATH not in response.text, path
        assert "cannot read" in response.text


def test_the_operator_can_ask_to_see_paths() -> None:
    application, worker = scripted_app(NodeConfig(show_model_paths=True))
    worker.script = (ErrorChunk(error="generation_failed", message=LOAD_FAILURE),)
    with TestClient(application) as client:
        assert json.loads(client.get("/state").text)["runners"]["runner-scripted"]["model_path"] == MODEL_PATH
        assert MODEL_PATH in client.post("/v1/chat/completions", json=HELLO).text


def test_paths_are_hidden_as_given_and_resolved_longest_first(tmp_path: Path) -> None:
    models = tmp_path / "models"
    model = models / "qwen-abc123"
    model.mkdir(parents=True)
    runner = RunnerInfo(
        runner_id=RunnerId("r"),
        model_id=ModelId("qwen"),
        model_path=str(model),
        shard=ShardAssignment(),
        status="failed",
        last_error=f"cannot load model from {model}: missing {models}/other/config.json",
    )
    hider = PathHider(State(runners={runner.runner_id: runner}), storage_directories(models, tmp_path / "home"))
    hidden = hider.state(State(runners={runner.runner_id: runner}))
    assert hidden.runners[runner.runner_id].last_error == (
        "cannot load model from <qwen>: missing <models dir>/other/config.json"
    )
    assert hider.text(f"{Path.home()}/notes.txt") == "~/notes.txt"
