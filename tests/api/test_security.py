"""Security defaults: loopback bind, the API key on every route but /health, the exposure warning, and
`--trust-remote-code` (off unless asked) reaching model loading in the runner."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from exo.main import build_parser, config_from_args
from exo.models.errors import ModelLoadError
from exo.node import NodeConfig
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.model_loader import load_model
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_REPLY, ResponseLike, ScriptedMaster, scripted_app
from tests.exo_server import fixture_model, free_port, held_weights, isolation, running_exo
from tests.fixtures.fixture_specs import GREETING_REPLY

API_KEY = "sk-test-0123456789"
HELLO = [{"role": "user", "content": "Hello!"}]
CLOSED_ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/state"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
]


@pytest.fixture
def keyed_app() -> Iterator[tuple[TestClient, ScriptedMaster]]:
    application, master = scripted_app(NodeConfig(api_key=API_KEY))
    with TestClient(application) as client:
        yield client, master


def assert_unauthorized(response: ResponseLike) -> None:
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {
            "message": "missing or invalid API key",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize(("method", "path"), CLOSED_ROUTES)
def test_every_route_but_health_needs_the_key(
    keyed_app: tuple[TestClient, ScriptedMaster], method: str, path: str
) -> None:
    client, master = keyed_app
    body = {"model": SCRIPTED_MODEL, "messages": HELLO} if method == "POST" else None
    assert_unauthorized(client.request(method, path, json=body))
    assert master.tasks == []


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-key",
        f"Bearer {API_KEY}x",
        f"Bearer {API_KEY[:-1]}",
        f"Bearer {API_KEY.upper()}",
        f"Bearer  {API_KEY}",
        API_KEY,
        f"Basic {API_KEY}",
        "Bearer ",
        "",
    ],
)
def test_a_wrong_key_is_refused(keyed_app: tuple[TestClient, ScriptedMaster], authorization: str) -> None:
    client, master = keyed_app
    response = client.post(
        "/v1/chat/completions",
        json={"model": SCRIPTED_MODEL, "messages": HELLO},
        headers={"Authorization": authorization},
    )
    assert_unauthorized(response)
    assert master.tasks == []


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_the_bearer_scheme_is_case_insensitive(keyed_app: tuple[TestClient, ScriptedMaster], scheme: str) -> None:
    client, master = keyed_app
    headers = {"Authorization": f"{scheme} {API_KEY}"}
    response = client.post("/v1/chat/completions", json={"model": SCRIPTED_MODEL, "messages": HELLO}, headers=headers)
    assert response.status_code == 200, response.text  # RFC 7235: the scheme is case-insensitive, the key is not
    assert len(master.tasks) == 1


def test_the_right_key_opens_every_route(keyed_app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = keyed_app
    headers = {"Authorization": f"Bearer {API_KEY}"}
    for method, path in CLOSED_ROUTES:
        body = {"model": SCRIPTED_MODEL, "messages": HELLO} if method == "POST" else None
        assert client.request(method, path, json=body, headers=headers).status_code == 200, path
    assert [card["id"] for card in client.get("/v1/models", headers=headers).json()["data"]] == [SCRIPTED_MODEL]
    completion = client.post("/v1/chat/completions", json={"model": SCRIPTED_MODEL, "messages": HELLO}, headers=headers)
    assert completion.json()["choices"][0]["message"]["content"] == SCRIPTED_REPLY
    assert len(master.tasks) == 2


def test_health_is_open_without_a_key(keyed_app: tuple[TestClient, ScriptedMaster]) -> None:
    client, _ = keyed_app
    assert client.get("/health").json() == {"status": "ok"}


def test_the_key_is_checked_before_the_body_is_read(keyed_app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = keyed_app
    for content in (b"{not json", b"x" * (40 * 1024 * 1024)):
        response = client.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
        assert_unauthorized(response)
    assert master.tasks == []


def test_without_a_key_configured_routes_are_open() -> None:
    application, _ = scripted_app(NodeConfig(api_key=None))
    with TestClient(application) as client:
        assert client.get("/v1/models").status_code == 200


def test_cli_defaults_bind_loopback_without_key_or_remote_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_API_KEY", raising=False)
    config = config_from_args(build_parser().parse_args([]))
    assert config.host == "127.0.0.1"
    assert config.api_key is None
    assert config.trust_remote_code is False


def test_cli_takes_the_key_from_the_flag_or_exo_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXO_API_KEY", "from-env")
    assert config_from_args(build_parser().parse_args([])).api_key == "from-env"
    assert config_from_args(build_parser().parse_args(["--api-key", "from-flag"])).api_key == "from-flag"
    monkeypatch.setenv("EXO_API_KEY", "")
    assert config_from_args(build_parser().parse_args([])).api_key is None


def test_cli_trust_remote_code_flag() -> None:
    assert config_from_args(build_parser().parse_args(["--trust-remote-code"])).trust_remote_code is True


# ---- real server ---------------------------------------------------------------------------------------------


@dataclass
class ExoProcess:
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.1)


@contextmanager
def exo_process(arguments: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> Generator[ExoProcess]:
    """`python -m exo` on a free port with `arguments`; stopped (SIGINT, then SIGKILL) on exit."""
    port = free_port()
    log_path = tmp_path / f"exo-{port}.log"
    command = [sys.executable, "-m", "exo", "--api-port", str(port), "--models-dir", str(tmp_path / "models")]
    isolating_arguments, isolating_env = isolation(tmp_path / f"home-{port}")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, *isolating_arguments, *held_weights(arguments), *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **isolating_env, **(env or {})},
        )
    try:
        yield ExoProcess(process, f"http://127.0.0.1:{port}", log_path)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _runner_ready(base_url: str, headers: dict[str, str]) -> bool:
    try:
        runners = httpx.get(f"{base_url}/state", headers=headers, timeout=5).json().get("runners", {})
    except httpx.HTTPError:
        return False
    return bool(runners) and all(runner["status"] == "ready" for runner in runners.values())


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoProcess]:
    # The key comes from the environment, as an operator would set it.
    tmp_path = tmp_path_factory.mktemp("exo-keyed")
    arguments = ["--model", str(fixture_model("tiny-qwen-tools"))]
    with exo_process(arguments, tmp_path, env={"EXO_API_KEY": API_KEY}) as running:
        # Starting the node and loading the model takes ~40 s on a loaded 2-core machine: a generous bound.
        running.wait_until(lambda: _runner_ready(running.base_url, {"Authorization": f"Bearer {API_KEY}"}), 300)
        yield running


def test_a_real_server_enforces_the_key_from_exo_api_key(keyed_server: ExoProcess) -> None:
    base = keyed_server.base_url
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    assert_unauthorized(httpx.get(f"{base}/v1/models"))
    assert_unauthorized(httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer nope"}))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="nope", max_retries=0).chat.completions.create(
            model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}]
        )
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
    assert [model.id for model in client.models.list()] == ["tiny-qwen-tools"]
    completion = client.chat.completions.create(
        model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}]
    )
    assert completion.choices[0].message.content == GREETING_REPLY


def _exo_log_until(arguments: list[str], needle: str, tmp_path: Path) -> str:
    """Start `python -m exo` with `arguments` and return its log once `needle` appears."""
    with exo_process(arguments, tmp_path) as running:
        running.wait_until(lambda: needle in running.log())
        return running.log()


EXPOSED_WARNING = "listening on 0.0.0.0 without an API key"


def test_binding_all_interfaces_without_a_key_logs_a_warning(tmp_path: Path) -> None:
    log = _exo_log_until(["--host", "0.0.0.0", "--model", str(tmp_path / "no-model")], "exo API on", tmp_path)
    assert EXPOSED_WARNING in log
    assert " WARNING " in log.split(EXPOSED_WARNING)[0].splitlines()[-1]


def test_binding_all_interfaces_with_a_key_does_not_warn(tmp_path: Path) -> None:
    arguments = ["--host", "0.0.0.0", "--api-key", API_KEY, "--model", str(tmp_path / "no-model")]
    log = _exo_log_until(arguments, "exo API on", tmp_path)
    assert "without an API key" not in log


# ---- trust_remote_code ---------------------------------------------------------------------------------------

CUSTOM_ARCHITECTURE = '''"""A model's own architecture file: mlx-lm imports it only when trust_remote_code is on."""

from pathlib import Path

from mlx_lm.models.qwen2 import Model, ModelArgs

Path(__file__).with_name("custom_code_ran").touch()
__all__ = ["Model", "ModelArgs"]
'''


def custom_code_model(directory: Path) -> Path:
    """tiny-qwen-tools, but config.json asks mlx-lm to build it from a bundled Python file (qwen2 re-exported)."""
    model = directory / "tiny-custom-code"
    shutil.copytree(fixture_model("tiny-qwen-tools"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_file": "custom_arch.py"}))
    (model / "custom_arch.py").write_text(CUSTOM_ARCHITECTURE)
    return model


def test_a_model_with_its_own_code_does_not_load_by_default(tmp_path: Path) -> None:
    model = custom_code_model(tmp_path)
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        load_model(model, ShardAssignment())
    assert not (model / "custom_code_ran").exists()


def test_a_model_with_its_own_code_loads_when_trusted(tmp_path: Path) -> None:
    model = custom_code_model(tmp_path)
    loaded = load_model(model, ShardAssignment(), trust_remote_code=True)
    assert (model / "custom_code_ran").exists()
    assert loaded.context_length == 4096


def test_a_real_server_refuses_custom_code_unless_started_with_trust_remote_code(tmp_path: Path) -> None:
    model = custom_code_model(tmp_path)
    (tmp_path / "trusted").mkdir()
    with running_exo([model], tmp_path / "trusted", extra_args=["--trust-remote-code"]) as server:
        completion = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": "tiny-custom-code", "messages": HELLO},
            timeout=60,
        )
        assert completion.json()["choices"][0]["message"]["content"] == GREETING_REPLY
    assert (model / "custom_code_ran").exists()
    (model / "custom_code_ran").unlink()
    log = _exo_log_until(["--model", str(model)], "requires importing and running a custom module", tmp_path)
    assert "trust_remote_code" in log
    assert not (model / "custom_code_ran").exists()
