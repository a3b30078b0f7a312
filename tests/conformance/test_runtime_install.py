"""`exo conformance` from a runtime-only install: the built wheel in a fresh virtual environment with the project's
locked runtime dependencies and none of the development ones (so neither the openai nor the anthropic SDK).
Installed from uv's cache, offline (`uv sync` put every locked file there)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
GRAMMAR_PROBE = """
from exo.conformance.messages_contract import check_messages_stream
from exo.conformance.responses_contract import check_responses_stream
messages = check_messages_stream('event: message_stop\\ndata: {"type": "message_stop"}\\n\\n')
responses = check_responses_stream('event: response.completed\\ndata: {"type": "response.completed"}\\n\\n')
print(*[violation.rule for violation in (*messages.violations, *responses.violations)])
"""


def _run(arguments: list[str], timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        arguments,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPOSITORY,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(900)
def test_exo_conformance_passes_in_an_install_without_dev_dependencies(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv sets this project up; it must be on PATH"
    built = _run([uv, "build", "--wheel", "--offline", "--out-dir", str(tmp_path / "dist")], timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("exo-*.whl"))
    environment = tmp_path / "venv"
    runtime_only = ["--offline", "--frozen", "--no-dev", "--no-default-groups", "--no-install-project"]
    synced = _run(
        [uv, "sync", *runtime_only, "--python", sys.executable],
        timeout=600,
        env={"UV_PROJECT_ENVIRONMENT": str(environment)},
    )
    assert synced.returncode == 0, synced.stderr
    python = environment / "bin" / "python"
    installed = _run([uv, "pip", "install", "--offline", "--no-deps", "--python", str(python), str(wheel)], 300)
    assert installed.returncode == 0, installed.stderr
    for sdk in ("openai", "anthropic"):
        assert _run([str(python), "-c", f"import {sdk}"], timeout=60).returncode != 0, f"{sdk} must not be installed"
    conformance = _run([str(environment / "bin" / "exo"), "conformance"], timeout=300)
    assert conformance.returncode == 0, conformance.stdout + conformance.stderr
    summary = conformance.stdout.strip().splitlines()
    assert any(line.endswith("cases pass") and line.split("/")[0] == line.split("/")[1].split()[0] for line in summary)
    assert "harmony" in conformance.stdout
    assert "deepseek_v32" in conformance.stdout
    assert "openai-python is not installed" in conformance.stdout
    assert "anthropic is not installed" in conformance.stdout
    # Without the SDKs the Messages and Responses grammar checks still run: a stream that starts at its end fails.
    broken = _run([str(python), "-c", GRAMMAR_PROBE], timeout=120)
    assert broken.returncode == 0, broken.stderr
    assert {"messages:order", "responses:lifecycle"} <= set(broken.stdout.split()), broken.stdout
