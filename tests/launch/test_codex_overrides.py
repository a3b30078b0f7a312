"""Codex's launch overrides: each `-c` is valid TOML and together they make the config docs/AGENTS.md describes."""

import tomllib
from pathlib import Path
from typing import Any

from exo.launch import claude_code, codex, opencode
from exo.launch.plan import LaunchTarget, McpServer
from tests.clients.installed import pinned_clients


def _config(leading: tuple[str, ...]) -> dict[str, Any]:
    """The configuration the `-c key=value` arguments add up to, parsed as Codex parses them (TOML values)."""
    assert leading[0::2] == ("-c",) * (len(leading) // 2)
    config: dict[str, Any] = {}
    for override in leading[1::2]:
        key, _, value = override.partition("=")
        *tables, leaf = key.split(".")
        node = config
        for table in tables:
            node = node.setdefault(table, {})
        node[leaf] = tomllib.loads(f"value = {value}")["value"]
    return config


def test_the_overrides_make_exo_the_provider_with_hosted_tools_off_and_a_workspace_sandbox() -> None:
    plan = codex.plan(
        LaunchTarget(url="http://127.0.0.1:52415", model="qwen2.5-coder-0.5b-instruct", context_length=32768)
    )

    assert _config(plan.leading_arguments) == {
        "model": "qwen2.5-coder-0.5b-instruct",
        "model_provider": "exo",
        "model_providers": {"exo": {"name": "exo", "base_url": "http://127.0.0.1:52415/v1", "wire_api": "responses"}},
        "model_context_window": 32768,
        "web_search": "disabled",
        "agents": {"enabled": False},
        "sandbox_mode": "workspace-write",
    }
    assert plan.environment == {}
    assert plan.files == {}


def test_an_api_key_is_read_by_name_from_the_environment() -> None:
    server = McpServer(command="/py", arguments=("-m", "exo", "mcp", "--url", "http://h:1"))
    plan = codex.plan(LaunchTarget(url="http://h:1", api_key="k", model="m", mcp=server))

    config = _config(plan.leading_arguments)
    assert "k" not in plan.leading_arguments[1::2]
    assert config["model_providers"] == {
        "exo": {"name": "exo", "base_url": "http://h:1/v1", "wire_api": "responses", "env_key": "EXO_API_KEY"}
    }
    assert config["mcp_servers"] == {
        "exo": {"command": "/py", "args": ["-m", "exo", "mcp", "--url", "http://h:1"], "env_vars": ["EXO_API_KEY"]}
    }
    assert plan.environment == {"EXO_API_KEY": "k"}


def test_a_value_with_quotes_and_backslashes_survives_as_toml() -> None:
    plan = codex.plan(LaunchTarget(url="http://h:1", model='odd "name" \\ here'))
    assert _config(plan.leading_arguments)["model"] == 'odd "name" \\ here'


def test_exec_gets_the_git_check_flag_once_and_interactive_runs_none() -> None:
    plan = codex.plan(LaunchTarget(url="http://h:1", model="m"))
    binary = Path("/bin/codex")
    overrides = list(plan.leading_arguments)

    assert plan.command(binary, ["exec", "--json", "do it"]) == [
        "/bin/codex",
        *overrides,
        "exec",
        "--skip-git-repo-check",
        "--json",
        "do it",
    ]
    assert plan.command(binary, ["e", "do it"]) == ["/bin/codex", *overrides, "e", "--skip-git-repo-check", "do it"]
    assert plan.command(binary, ["exec", "--skip-git-repo-check", "x"]) == [
        "/bin/codex",
        *overrides,
        "exec",
        "--skip-git-repo-check",
        "x",
    ]
    assert plan.command(binary, ["explain exec"]) == ["/bin/codex", *overrides, "explain exec"]
    assert plan.command(binary, []) == ["/bin/codex", *overrides]


def test_the_tested_versions_are_the_pinned_ones() -> None:
    """The install command a launch prints names the version .ci/install-clients installs for the tests."""
    pinned = pinned_clients()
    for client in (opencode.CLIENT, claude_code.CLIENT, codex.CLIENT):
        entry = pinned[client.folder]
        assert (entry.binary, entry.package, entry.version) == (client.binary, client.package, client.tested_version)


def test_loop_guard_is_a_header_of_the_exo_provider() -> None:
    plan = codex.plan(LaunchTarget(url="http://h:1", model="m", loop_guard="block"))
    provider = _config(plan.leading_arguments)["model_providers"]["exo"]
    assert provider["http_headers"] == {"X-Exo-Loop-Guard": "block"}
    assert (
        "http_headers"
        not in _config(codex.plan(LaunchTarget(url="http://h:1", model="m")).leading_arguments)["model_providers"][
            "exo"
        ]
    )
