"""Claude Code's launch environment: every model slot on the served model, exo's URL and key, a stable prompt."""

import json
from pathlib import Path

from exo.launch import claude_code
from exo.launch.plan import LaunchTarget, McpServer


def test_every_model_slot_is_the_served_model_and_the_prompt_settings_are_set(tmp_path: Path) -> None:
    target = LaunchTarget(url="http://127.0.0.1:52415", model="qwen2.5-coder-0.5b-instruct")
    plan = claude_code.plan(target, tmp_path)

    assert plan.files == {}
    assert plan.leading_arguments == ()
    model = "qwen2.5-coder-0.5b-instruct"
    assert plan.environment == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:52415",
        "ANTHROPIC_AUTH_TOKEN": "exo",
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "API_TIMEOUT_MS": "3600000",
    }


def test_the_users_anthropic_key_and_other_providers_do_not_reach_through(tmp_path: Path) -> None:
    plan = claude_code.plan(LaunchTarget(url="http://h:1", api_key="k", model="m"), tmp_path)
    inherited = {
        "ANTHROPIC_API_KEY": "sk-ant-real",
        "ANTHROPIC_BASE_URL": "https://api.anthropic.com",
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "PATH": "/usr/bin",
    }
    environment = plan.environment_for(inherited)
    assert environment["ANTHROPIC_API_KEY"] == ""
    assert environment["ANTHROPIC_AUTH_TOKEN"] == "k"
    assert environment["ANTHROPIC_BASE_URL"] == "http://h:1"
    assert "CLAUDE_CODE_USE_BEDROCK" not in environment
    assert environment["PATH"] == "/usr/bin"


def test_mcp_writes_a_config_file_named_in_one_argument_before_the_users(tmp_path: Path) -> None:
    target = LaunchTarget(url="http://h:1", model="m", mcp=McpServer(command="/py", arguments=("-m", "exo", "mcp")))
    plan = claude_code.plan(target, tmp_path)

    ((path, content),) = plan.files.items()
    assert json.loads(content) == {"mcpServers": {"exo": {"command": "/py", "args": ["-m", "exo", "mcp"]}}}
    # `--mcp-config` takes several values: in one word it cannot swallow the user's prompt after it.
    assert plan.command(Path("/bin/claude"), ["fix it", "-p"]) == [
        "/bin/claude",
        f"--mcp-config={path}",
        "fix it",
        "-p",
    ]


def test_loop_guard_is_a_custom_header_line_added_after_the_users_own(tmp_path: Path) -> None:
    plan = claude_code.plan(LaunchTarget(url="http://h:1", model="m", loop_guard="warn"), tmp_path)

    assert "ANTHROPIC_CUSTOM_HEADERS" not in plan.environment
    assert plan.environment_for({})["ANTHROPIC_CUSTOM_HEADERS"] == "X-Exo-Loop-Guard: warn"
    # Claude Code reads one `Name: value` a line: the user's headers stay, exo's comes after them.
    users = {"ANTHROPIC_CUSTOM_HEADERS": "X-Team: blue\nX-Trace: 1\n"}
    assert plan.environment_for(users)["ANTHROPIC_CUSTOM_HEADERS"] == "X-Team: blue\nX-Trace: 1\nX-Exo-Loop-Guard: warn"


def test_without_loop_guard_the_users_custom_headers_are_left_alone(tmp_path: Path) -> None:
    plan = claude_code.plan(LaunchTarget(url="http://h:1", model="m"), tmp_path)
    assert (
        plan.environment_for({"ANTHROPIC_CUSTOM_HEADERS": "X-Team: blue"})["ANTHROPIC_CUSTOM_HEADERS"] == "X-Team: blue"
    )
    assert "ANTHROPIC_CUSTOM_HEADERS" not in plan.environment_for({})
