"""Models that cannot be loaded: a clear reason in /state and in every request's error, nothing half-written left
in the models directory, and the node keeps serving its other models."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from exo.models import catalog_fetch
from exo.models.catalog import DEFAULT_MODEL_ID, QWEN25_CODER_05B
from exo.models.errors import ModelLoadError
from exo.models.resolve import resolve_model
from exo.node import NodeConfig
from tests.exo_server import ExoServer, fixture_model, free_port, held_weights, isolation
from tests.fixtures.fixture_specs import GREETING_REPLY
from tests.in_process_node import in_process_node
from tests.models.tiny_gguf import build_model, build_tokenizer, write_gguf


@contextmanager
def exo_node(models: Sequence[str], tmp_path: Path) -> Generator[ExoServer]:
    """Start `python -m exo` and wait only for its API: some of these models are meant never to become ready."""
    port = free_port()
    log_path = tmp_path / f"exo-{port}.log"
    arguments = [sys.executable, "-m", "exo", "--api-port", str(port), "--models-dir", str(tmp_path / "models")]
    for model in models:
        arguments += ["--model", model]
    isolating_arguments, isolating_env = isolation(tmp_path / f"home-{port}")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            arguments + isolating_arguments + held_weights(()),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **isolating_env},
            start_new_session=True,
        )
    server = ExoServer(process=process, port=port, log_path=log_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{server.base_url}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield server
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_runners(server: ExoServer, wanted: dict[str, str], timeout: float = 60) -> dict[str, dict[str, object]]:
    """Poll /state until each model id in `wanted` has a runner in the wanted status; return runners by model id."""
    deadline = time.monotonic() + timeout
    by_model: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline:
        by_model = {str(runner["model_id"]): runner for runner in server.runners()}
        if all(by_model.get(model, {}).get("status") == status for model, status in wanted.items()):
            return by_model
        time.sleep(0.1)
    raise TimeoutError(f"runners never reached {wanted}: {by_model}\n{server.log()}")


def chat(server: ExoServer, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}]}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)


def write_tiny_gguf(path: Path) -> bytes:
    tokenizer = build_tokenizer()
    write_gguf(path, "qwen2", build_model("qwen2", tokenizer, seed=3), tokenizer, with_output=True)
    return path.read_bytes()


def test_corrupt_weights_and_a_truncated_gguf_fail_clearly_while_the_other_model_serves(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt-qwen"
    shutil.copytree(fixture_model("tiny-qwen-tools"), corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file" * 64)
    truncated = tmp_path / "Truncated.gguf"
    data = write_tiny_gguf(truncated)
    truncated.write_bytes(data[: len(data) // 2])

    with exo_node([str(corrupt), str(truncated), str(fixture_model("tiny-qwen-tools"))], tmp_path) as server:
        runners = wait_for_runners(
            server, {"corrupt-qwen": "failed", "truncated": "failed", "tiny-qwen-tools": "ready"}
        )
        # The reason names the file by the model it belongs to; where it lives is in the log, not in API answers.
        corrupt_error = str(runners["corrupt-qwen"]["last_error"])
        assert "<corrupt-qwen>/model.safetensors" in corrupt_error
        assert "Invalid json header" in corrupt_error
        gguf_error = str(runners["truncated"]["last_error"])
        assert "<truncated>" in gguf_error
        assert "truncated or corrupt" in gguf_error
        assert str(tmp_path) not in json.dumps(server.state())
        assert str(corrupt / "model.safetensors") in server.log()

        for model, reason in (("corrupt-qwen", "Invalid json header"), ("truncated", "truncated or corrupt")):
            response = chat(server, model)
            assert response.status_code == 503
            error = response.json()["error"]
            assert error["code"] == "model_unavailable"
            assert reason in error["message"]
            assert str(tmp_path) not in error["message"]
            assert set(error) >= {"message", "type", "param", "code"}

        served = chat(server, "tiny-qwen-tools")
        assert served.status_code == 200
        assert served.json()["choices"][0]["message"]["content"] == GREETING_REPLY

        time.sleep(1.0)  # a load error is final: the runner is not restarted over and over
        runners = wait_for_runners(server, {"corrupt-qwen": "failed"})
        assert runners["corrupt-qwen"]["restarts"] == 0
        models_dir = tmp_path / "models"
        assert not models_dir.exists() or list(models_dir.iterdir()) == []
    assert (corrupt / "config.json").is_file()  # the user's own files are reported, never deleted


@pytest.mark.parametrize("kept", [0.0, 0.02, 0.5, 0.999])
def test_a_truncated_gguf_is_a_load_error_that_leaves_the_models_dir_empty(tmp_path: Path, kept: float) -> None:
    source = tmp_path / "Tiny.gguf"
    data = write_tiny_gguf(source)
    source.write_bytes(data[: int(len(data) * kept)])
    models_dir = tmp_path / "models"
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        resolve_model(str(source), models_dir)
    assert not models_dir.exists() or list(models_dir.iterdir()) == []


HOLD_STAGING = """
import sys, time
from pathlib import Path
from exo.models.staging import staged_directory
with staged_directory(Path(sys.argv[1])) as staging:
    (staging / "model.safetensors").write_bytes(b"half written")
    print(staging, flush=True)
    time.sleep(120)
"""


def hold_staging(target: Path) -> tuple[subprocess.Popen[str], Path]:
    """Start a process that is midway through writing `target`; return it and its staging dir."""
    process = subprocess.Popen([sys.executable, "-c", HOLD_STAGING, str(target)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    staging = Path(process.stdout.readline().strip())
    assert (staging / "model.safetensors").is_file()
    return process, staging


def test_staging_left_by_a_killed_import_is_removed_by_the_next_one_and_a_live_one_is_kept(tmp_path: Path) -> None:
    source = tmp_path / "Tiny.gguf"
    write_tiny_gguf(source)
    models_dir = tmp_path / "models"
    target = resolve_model(str(source), models_dir).path
    shutil.rmtree(target)
    killed, abandoned = hold_staging(target)
    killed.kill()
    killed.wait()
    alive, in_progress = hold_staging(target)
    try:
        resolved = resolve_model(str(source), models_dir)
        assert resolved.path == target
        assert (target / "config.json").is_file()
        assert not abandoned.exists()
        assert in_progress.exists()
        assert sorted(entry.name for entry in models_dir.iterdir()) == sorted([target.name, in_progress.name])
    finally:
        alive.kill()
        alive.wait()


def corrupt_pieces(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the default model's installed PyPI pieces the right count but the wrong bytes."""
    directory.mkdir()
    pieces: list[Path] = []
    for number in range(1, len(QWEN25_CODER_05B.source.pieces) + 1):
        piece = directory / f"part{number:02d}.bin"
        piece.write_bytes(bytes([number]) * 4096)
        pieces.append(piece)
    monkeypatch.setattr(catalog_fetch, "installed_piece_paths", lambda _source: pieces)


def test_default_model_pieces_with_the_wrong_sha256_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupt_pieces(tmp_path / "pieces", monkeypatch)
    models_dir = tmp_path / "models"
    with pytest.raises(ModelLoadError, match=f"corrupt: joined they are {6 * 4096} bytes with sha256 .* expected"):
        resolve_model(None, models_dir)
    assert list(models_dir.iterdir()) == []


async def test_a_node_whose_default_model_is_corrupt_reports_it_in_state_and_answers_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corrupt_pieces(tmp_path / "pieces", monkeypatch)
    async with in_process_node(NodeConfig(models=(None,), models_dir=tmp_path / "models"), tmp_path) as (node, client):
        with anyio.fail_after(30):
            while not node.master_client.state.runners:
                await anyio.sleep(0.05)
        state = (await client.get("/state")).json()
        [runner] = state["runners"].values()
        assert runner["model_id"] == DEFAULT_MODEL_ID
        assert runner["status"] == "failed"
        assert "model pieces are corrupt" in runner["last_error"]
        # The preparation's own record, on the node that prepared, says how far it got before the check failed.
        [node_state] = state["nodes"].values()
        assert node_state["preparing"] == []
        preparation = node_state["preparations"][DEFAULT_MODEL_ID]
        assert preparation["phase"] == "failed"
        assert preparation["done_bytes"] == preparation["total_bytes"] == 6 * 4096
        assert "model pieces are corrupt" in preparation["error"]
        response = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "model_unavailable"
        assert "model pieces are corrupt" in error["message"]
        assert json.loads((await client.get("/health")).text) == {"status": "ok"}
    assert list((tmp_path / "models").iterdir()) == []
