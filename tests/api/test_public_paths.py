"""Model paths stay out of API answers (/state, the cluster views, refusals, error messages streamed or not) unless
the operator asks."""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from exo.api.public_paths import PathHider, storage_directories
from exo.master.client import TaskHandle
from exo.models.resolve import resolve_model
from exo.node import NodeConfig
from exo.shared.errors import RunnerUnavailableError
from exo.shared.types.blas import BlasReport
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import InstanceId, ModelId, RunnerId
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.state import NodeHealth, RunnerInfo, State
from exo.shared.types.worker.shards import ParallelChoice, ShardAssignment
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_NODE, ScriptedMaster, scripted_app
from tests.exo_server import fixture_model, running_exo

MODEL_PATH = "/nonexistent/scripted-model"  # where inprocess_app says the scripted model lives
HELLO = {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
LOAD_FAILURE = f"generation failed: OSError: cannot read {MODEL_PATH}/model.safetensors"


@pytest.fixture
def hidden() -> Iterator[tuple[TestClient, ScriptedMaster]]:
    application, master = scripted_app()
    with TestClient(application) as client:
        yield client, master


def test_state_and_cluster_views_show_the_model_not_where_it_lives(hidden: tuple[TestClient, ScriptedMaster]) -> None:
    client, _ = hidden
    state = client.get("/state")
    assert MODEL_PATH not in state.text
    (runner,) = state.json()["runners"].values()
    assert runner["model_path"] == f"<{SCRIPTED_MODEL}>"
    for path in ("/v1/cluster", "/v1/cluster/nodes", "/v1/models"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert MODEL_PATH not in response.text, path


def test_a_failed_preparation_and_node_health_do_not_show_paths(
    hidden: tuple[TestClient, ScriptedMaster],
) -> None:
    client, master = hidden
    failed = ModelPreparation(
        model_id=ModelId("other"),
        phase="failed",
        done_bytes=0,
        total_bytes=1,
        started_at=1.0,
        updated_at=2.0,
        error=f"cannot read {MODEL_PATH}/weights.gguf",
    )
    node = master.state.nodes[SCRIPTED_NODE]
    degraded = NodeHealth(status="degraded", reason=f"runner for other failed: {failed.error}")
    # A request another node's API took, recorded there with --show-model-paths: its error keeps the path.
    request = RequestRecord(
        dialect="responses",
        model_id=SCRIPTED_MODEL,
        served_by=SCRIPTED_NODE,
        outcome="failed",
        error_kind="generation_failed",
        error=LOAD_FAILURE,
        ended_at=3.0,
    )
    update = {"preparations": {failed.model_id: failed}, "health": degraded, "recent_requests": (request,)}
    master.state = master.state.model_copy(update={"nodes": {SCRIPTED_NODE: node.model_copy(update=update)}})
    state = client.get("/state")
    assert MODEL_PATH not in state.text
    shown = state.json()["nodes"][SCRIPTED_NODE]
    assert shown["preparations"]["other"]["error"] == f"cannot read <{SCRIPTED_MODEL}>/weights.gguf"
    assert shown["health"]["reason"] == f"runner for other failed: cannot read <{SCRIPTED_MODEL}>/weights.gguf"
    assert (
        shown["recent_requests"][0]["error"]
        == f"generation failed: OSError: cannot read <{SCRIPTED_MODEL}>/model.safetensors"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_task_does_not_show_the_model_path(hidden: tuple[TestClient, ScriptedMaster], stream: bool) -> None:
    client, master = hidden
    master.script = (ErrorChunk(error="generation_failed", message=LOAD_FAILURE),)
    response = client.post("/v1/chat/completions", json={**HELLO, "stream": stream})
    assert MODEL_PATH not in response.text
    assert f"cannot read <{SCRIPTED_MODEL}>/model.safetensors" in response.text
    # What the cluster keeps about the request says it without the path too.
    (record,) = master.requests
    assert record.error == f"generation failed: OSError: cannot read <{SCRIPTED_MODEL}>/model.safetensors"


def test_an_error_mid_stream_does_not_show_the_model_path(hidden: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = hidden
    master.script = (TokenChunk(text="Hi"), ErrorChunk(error="generation_failed", message=LOAD_FAILURE))
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


class _UnavailableMaster(ScriptedMaster):
    """Refuses every task the way a worker whose model failed to load does: naming the model's file."""

    async def submit_chat_completion(self, command: GenerateCommand) -> TaskHandle:
        raise RunnerUnavailableError(f"model '{command.model_id}' failed to load: {MODEL_PATH}/config.json is missing")


def test_a_refusal_does_not_show_the_model_path() -> None:
    application, _ = scripted_app(master=_UnavailableMaster())
    with TestClient(application) as client:
        response = client.post("/v1/chat/completions", json=HELLO)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "model_unavailable"
    assert error["message"] == f"model '{SCRIPTED_MODEL}' failed to load: <{SCRIPTED_MODEL}>/config.json is missing"


BLAS_LIBRARY = "/opt/exo-install/.venv/lib/libmkl_rt.so.3"


def _with_blas_library(master: ScriptedMaster) -> None:
    runner = master.state.runners[RunnerId("runner-scripted")]
    assert runner.metadata is not None
    blas = BlasReport(kind="mkl", source="pypi", library=BLAS_LIBRARY, matmul_gflops=100.0, matmul_size=512)
    metadata = runner.metadata.model_copy(update={"blas": blas})
    runners = {runner.runner_id: runner.model_copy(update={"metadata": metadata})}
    master.state = master.state.model_copy(update={"runners": runners})


def test_the_blas_library_is_named_by_its_file_not_where_the_install_put_it() -> None:
    application, master = scripted_app()
    _with_blas_library(master)
    with TestClient(application) as client:
        state = client.get("/state")
    assert BLAS_LIBRARY not in state.text
    assert state.json()["runners"]["runner-scripted"]["metadata"]["blas"]["library"] == "libmkl_rt.so.3"
    application, master = scripted_app(NodeConfig(show_model_paths=True))
    _with_blas_library(master)
    with TestClient(application) as client:
        assert client.get("/state").json()["runners"]["runner-scripted"]["metadata"]["blas"]["library"] == BLAS_LIBRARY


# An absolute path of two parts or more, not inside a URL, a label (`<models dir>/x`) or a route's own path.
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.<>])/(?:[\w.+-]+/)+[\w.+-]+")
READ_ROUTES = ("/state", "/metrics", "/v1/models", "/v1/cluster", "/v1/cluster/nodes", "/v1/cluster/metrics")
OLLAMA_READ_ROUTES = ("/api/tags", "/api/ps", "/api/version")


@pytest.mark.slow
def test_no_answer_of_a_real_node_holds_an_absolute_path(tmp_path: Path) -> None:
    with (
        running_exo([fixture_model("tiny-qwen-tools")], tmp_path) as node,
        httpx.Client(base_url=node.base_url, timeout=60) as client,
    ):
        answered = client.post("/v1/chat/completions", json={**HELLO, "model": "tiny-qwen-tools", "max_tokens": 4})
        assert answered.status_code == 200, answered.text
        answers = {route: client.get(route) for route in READ_ROUTES + OLLAMA_READ_ROUTES}
        answers["/api/show"] = client.post("/api/show", json={"model": "tiny-qwen-tools"})
        runner = node.runner("tiny-qwen-tools")
    for route, answer in answers.items():
        assert answer.status_code == 200, (route, answer.text)
        assert ABSOLUTE_PATH.findall(answer.text) == [], route
    metadata = cast(dict[str, Any], runner["metadata"])
    # The check above could fail: a real runner reports a BLAS library when it found one to preload.
    if metadata["blas"]["library"] is not None:
        assert "/" not in metadata["blas"]["library"]


def test_the_operator_can_ask_to_see_paths() -> None:
    application, master = scripted_app(NodeConfig(show_model_paths=True))
    master.script = (ErrorChunk(error="generation_failed", message=LOAD_FAILURE),)
    with TestClient(application) as client:
        assert json.loads(client.get("/state").text)["runners"]["runner-scripted"]["model_path"] == MODEL_PATH
        assert MODEL_PATH in client.post("/v1/chat/completions", json=HELLO).text


def test_paths_are_hidden_as_given_and_resolved_longest_first(tmp_path: Path) -> None:
    models = tmp_path / "models"
    model = models / "qwen-abc123"
    model.mkdir(parents=True)
    runner = RunnerInfo(
        runner_id=RunnerId("r"),
        node_id=SCRIPTED_NODE,
        instance_id=InstanceId("i"),
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


class ResolvingMaster(ScriptedMaster):
    """Prepares a placed model the way the cluster's master does (resolve_model in its models directory)."""

    def __init__(self, models_dir: Path) -> None:
        super().__init__()
        self.models_dir = models_dir

    async def place_instance(self, spec: str, min_nodes: int, parallel: ParallelChoice = "auto") -> PlacedInstance:
        resolve_model(spec, self.models_dir)
        return await super().place_instance(spec, min_nodes, parallel)


def test_placing_a_path_tells_a_client_nothing_about_what_is_on_disk(tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    not_a_model = tmp_path / "plain-directory"
    not_a_model.mkdir()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("private")
    application, _ = scripted_app(NodeConfig(models_dir=models_dir), ResolvingMaster(models_dir))
    with TestClient(application) as client:
        specs = (str(not_a_model), str(a_file), str(tmp_path / "missing"), "~/missing", "./missing")
        answers = [client.post("/v1/cluster/instances", json={"model": spec, "min_nodes": 1}) for spec in specs]
        unknown_id = client.post("/v1/cluster/instances", json={"model": "gpt-5", "min_nodes": 1})

    assert {answer.status_code for answer in answers} == {400}
    # One message for a directory that is not a model, a file and a path that does not exist (apart from the spec the
    # client sent, which the message quotes back).
    messages = {
        answer.json()["error"]["message"].replace(repr(spec), "SPEC")
        for answer, spec in zip(answers, specs, strict=True)
    }
    assert len(messages) == 1, messages
    assert all(str(tmp_path) not in message for message in messages)
    # An id keeps its reason, with the models directory shown by its label.
    assert unknown_id.status_code == 400
    message = unknown_id.json()["error"]["message"]
    assert "gpt-5" in message
    assert "<models dir>" in message
    assert str(models_dir) not in message


def test_with_show_model_paths_a_path_keeps_its_reason(tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    not_a_model = tmp_path / "plain-directory"
    not_a_model.mkdir()
    config = NodeConfig(models_dir=models_dir, show_model_paths=True)
    application, _ = scripted_app(config, ResolvingMaster(models_dir))
    with TestClient(application) as client:
        answer = client.post("/v1/cluster/instances", json={"model": str(not_a_model), "min_nodes": 1})
    assert answer.status_code == 400
    assert "no config.json" in answer.json()["error"]["message"]
