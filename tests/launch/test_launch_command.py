"""`exo launch` as a user runs it: a real `python -m exo launch` process against exo's real API on a real port (its
runner scripted), with a stand-in client that records how it was started.

The stand-in proves what no configuration test can: exo replaces itself with the client (same process id), the
client gets the user's arguments after the launch's own and the planned environment, and its exit status is the
command's. The errors are the ones a user meets first: no node, no client, a model that is not served, a wrong key.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo.node import NodeConfig
from tests.api.inprocess_app import SCRIPTED_MODEL, scripted_app
from tests.launch.scripted_api import serving
from tests.ports import free_port

# Records its process id, arguments and the variables the launch sets, prints a line, exits 7.
STAND_IN = """#!/bin/sh
{
  echo "pid=$$"
  for word in "$@"; do echo "arg=$word"; done
  echo "OPENCODE_CONFIG=$OPENCODE_CONFIG"
  echo "ANTHROPIC_BASE_URL=$ANTHROPIC_BASE_URL"
  echo "ANTHROPIC_MODEL=$ANTHROPIC_MODEL"
  echo "EXO_API_KEY=$EXO_API_KEY"
} > "$RECORD"
echo "the client's own output"
exit 7
"""
LAUNCH_TIMEOUT_SECONDS = 120

# Each case starts `python -m exo launch`: seconds of imports on a busy machine.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    app, _ = scripted_app()
    with serving(app) as url:
        yield url


@pytest.fixture(scope="module")
def node_with_key() -> Iterator[str]:
    app, _ = scripted_app(NodeConfig(api_key="right-key"))
    with serving(app) as url:
        yield url


def _stand_in(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / name
    binary.write_text(STAND_IN)
    binary.chmod(0o755)
    return binary


def _launch(
    arguments: list[str], tmp_path: Path, *, path: str, extra: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, str]:
    """`python -m exo launch …` in its own project folder and EXO_HOME; returns the process and its output."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("EXO_", "OPENCODE"))}
    environment |= {
        "PATH": path,
        "EXO_HOME": str(tmp_path / "exo-home"),
        "RECORD": str(tmp_path / "record.txt"),
        # No pinned install to fall back on: PATH alone decides where the client is.
        "EXO_CLIENTS_DIR": str(tmp_path / "no-clients"),
        **(extra or {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "exo", "launch", *arguments],
        cwd=project,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=LAUNCH_TIMEOUT_SECONDS)
    return process, stdout, stderr


def _record(tmp_path: Path) -> list[str]:
    return (tmp_path / "record.txt").read_text().splitlines()


def test_the_client_replaces_exo_with_the_users_arguments_and_its_exit_status_is_the_commands(
    node: str, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "opencode")

    process, stdout, stderr = _launch(
        ["opencode", "--url", f"{node}/v1/", "--", "run", "two words", "--format", "json"],
        tmp_path,
        path=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )

    assert process.returncode == 7, stderr
    assert stdout == "the client's own output\n"
    assert f"opencode with {SCRIPTED_MODEL} at {node}" in stderr
    record = _record(tmp_path)
    assert record[0] == f"pid={process.pid}"  # exec: the client is the launched process itself
    assert record[1:5] == ["arg=run", "arg=two words", "arg=--format", "arg=json"]
    config_path = Path(record[5].removeprefix("OPENCODE_CONFIG="))
    assert config_path.parent == tmp_path / "exo-home" / "launch" / "opencode"
    config = json.loads(config_path.read_text())
    assert config["model"] == f"exo/{SCRIPTED_MODEL}"
    assert config["provider"]["exo"]["options"]["baseURL"] == f"{node}/v1"
    assert config["provider"]["exo"]["models"][SCRIPTED_MODEL]["limit"]["context"] == 4096
    # Nothing was written into the project.
    assert list((tmp_path / "project").iterdir()) == []


def test_claude_gets_the_nodes_key_and_model_in_its_environment(node_with_key: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "claude")

    process, _, stderr = _launch(
        ["claude", "--url", node_with_key, "--", "-p", "hi"],
        tmp_path,
        path=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        extra={"EXO_API_KEY": "right-key"},
    )

    assert process.returncode == 7, stderr
    assert _record(tmp_path)[1:] == [
        "arg=-p",
        "arg=hi",
        "OPENCODE_CONFIG=",
        f"ANTHROPIC_BASE_URL={node_with_key}",
        f"ANTHROPIC_MODEL={SCRIPTED_MODEL}",
        "EXO_API_KEY=right-key",
    ]


def test_no_node_answering_says_how_to_start_one(tmp_path: Path) -> None:
    client = _stand_in(tmp_path / "bin", "claude")
    url = f"http://127.0.0.1:{free_port()}"

    process, stdout, stderr = _launch(["claude", "--url", url, "--client-bin", str(client)], tmp_path, path=os.defpath)

    assert process.returncode == 1
    assert stdout == ""
    assert stderr.startswith(f"exo launch: exo is not reachable at {url}"), stderr
    assert "Start it with `uv run exo`" in stderr
    assert "--url" in stderr
    assert not (tmp_path / "record.txt").exists()


@pytest.mark.parametrize(
    ("client", "command"),
    [
        ("opencode", "npm install -g opencode-ai@1.18.33"),
        ("claude", "npm install -g @anthropic-ai/claude-code@2.1.197"),
        ("codex", "npm install -g @openai/codex@0.169.0"),
    ],
)
def test_a_missing_client_gives_the_npm_command_that_installs_it(client: str, command: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()

    process, _, stderr = _launch([client], tmp_path, path=str(empty))

    assert process.returncode == 1
    assert "is not installed" in stderr
    assert f"`{command}`" in stderr


def test_a_model_that_is_not_served_names_those_that_are(node: str, tmp_path: Path) -> None:
    client = _stand_in(tmp_path / "bin", "codex")

    process, _, stderr = _launch(
        ["codex", "--url", node, "--model", "qwen2.5-coder-1.5b-instruct", "--client-bin", str(client)],
        tmp_path,
        path=os.defpath,
    )

    assert process.returncode == 1
    assert f"model 'qwen2.5-coder-1.5b-instruct' is not served by the node at {node}; it serves: {SCRIPTED_MODEL}" in (
        stderr
    )
    assert not (tmp_path / "record.txt").exists()


def test_a_wrong_key_is_refused_with_how_to_give_the_right_one(node_with_key: str, tmp_path: Path) -> None:
    client = _stand_in(tmp_path / "bin", "codex")

    process, _, stderr = _launch(
        ["codex", "--url", node_with_key, "--api-key", "wrong", "--client-bin", str(client)], tmp_path, path=os.defpath
    )

    assert process.returncode == 1
    assert "refused the API key; pass --api-key or set EXO_API_KEY" in stderr


def test_dry_run_prints_the_command_and_hides_the_key(node_with_key: str, tmp_path: Path) -> None:
    client = _stand_in(tmp_path / "bin", "codex")

    process, stdout, stderr = _launch(
        ["codex", "--url", node_with_key, "--client-bin", str(client), "--dry-run", "--", "exec", "go"],
        tmp_path,
        path=os.defpath,
        extra={"EXO_API_KEY": "right-key"},
    )

    assert process.returncode == 0, stderr
    assert "right-key" not in stdout
    assert stdout.startswith(f"env EXO_API_KEY=*** {client} -c ")
    assert stdout.rstrip().endswith("exec --skip-git-repo-check go")
    assert not (tmp_path / "record.txt").exists()


def test_loop_guard_reaches_the_client_as_its_header_setting(node: str, tmp_path: Path) -> None:
    client = _stand_in(tmp_path / "bin", "claude")

    process, stdout, stderr = _launch(
        ["claude", "--url", node, "--client-bin", str(client), "--loop-guard", "answer", "--dry-run"],
        tmp_path,
        path=os.defpath,
        extra={"ANTHROPIC_CUSTOM_HEADERS": "X-Team: blue"},
    )

    assert process.returncode == 0, stderr
    assert "ANTHROPIC_CUSTOM_HEADERS='X-Team: blue\nX-Exo-Loop-Guard: answer'" in stdout


def test_an_unknown_loop_guard_policy_is_refused(tmp_path: Path) -> None:
    process, _, stderr = _launch(["claude", "--loop-guard", "sometimes"], tmp_path, path=os.defpath)
    assert process.returncode == 2
    assert "--loop-guard: invalid choice: 'sometimes'" in stderr
