"""opencode's launch configuration: the provider, model and settings docs/OPENCODE.md tells users to write."""

import json
from pathlib import Path

from exo.launch import opencode
from exo.launch.plan import LaunchTarget, McpServer


def _written(plan_files: dict[Path, str]) -> tuple[Path, dict[str, object]]:
    (path, content), *others = plan_files.items()
    assert others == []
    return path, json.loads(content)


def test_the_config_names_exo_as_provider_and_model_with_timeouts_off_and_edits_allowed(tmp_path: Path) -> None:
    target = LaunchTarget(url="http://10.0.0.5:52415", model="qwen2.5-coder-0.5b-instruct", context_length=32768)
    plan = opencode.plan(target, tmp_path)

    path, config = _written(plan.files)
    assert path.parent == tmp_path
    assert path.suffix == ".json"
    assert plan.environment == {"OPENCODE_CONFIG": str(path)}
    assert plan.leading_arguments == ()
    assert config == {
        "$schema": "https://opencode.ai/config.json",
        "model": "exo/qwen2.5-coder-0.5b-instruct",
        "small_model": "exo/qwen2.5-coder-0.5b-instruct",
        "permission": {"edit": "allow"},
        "provider": {
            "exo": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "exo",
                "options": {"baseURL": "http://10.0.0.5:52415/v1", "headerTimeout": False, "chunkTimeout": False},
                "models": {
                    "qwen2.5-coder-0.5b-instruct": {
                        "name": "qwen2.5-coder-0.5b-instruct (exo)",
                        "tool_call": True,
                        "limit": {"context": 32768, "output": 8192},
                    }
                },
            }
        },
    }


def test_an_api_key_stays_in_the_environment_and_the_file_refers_to_it(tmp_path: Path) -> None:
    target = LaunchTarget(url="http://127.0.0.1:52415", api_key="s3cret-key", model="m", context_length=2048)
    plan = opencode.plan(target, tmp_path)

    _, config = _written(plan.files)
    assert "s3cret-key" not in next(iter(plan.files.values()))
    assert plan.environment["EXO_API_KEY"] == "s3cret-key"
    provider = opencode.opencode_config(target).provider["exo"]
    assert provider.options.model_dump()["apiKey"] == "{env:EXO_API_KEY}"
    # A small context keeps three quarters of itself for the prompt.
    assert provider.models["m"].limit == opencode.ModelLimit(context=2048, output=512)
    assert config == json.loads(opencode.opencode_config(target).to_json())


def test_an_unknown_context_length_leaves_the_limit_to_opencode() -> None:
    config = opencode.opencode_config(LaunchTarget(url="http://h:1", model="m"))
    assert "limit" not in config.model_dump(exclude_none=True)["provider"]["exo"]["models"]["m"]


def test_mcp_adds_exo_mcp_as_a_local_server(tmp_path: Path) -> None:
    target = LaunchTarget(
        url="http://127.0.0.1:52415", model="m", mcp=McpServer(command="/py", arguments=("-m", "exo"))
    )
    _, config = _written(opencode.plan(target, tmp_path).files)
    assert config["mcp"] == {"exo": {"type": "local", "command": ["/py", "-m", "exo"], "enabled": True}}


def test_two_models_get_two_files_so_a_running_client_keeps_its_own(tmp_path: Path) -> None:
    first = opencode.plan(LaunchTarget(url="http://h:1", model="a"), tmp_path)
    second = opencode.plan(LaunchTarget(url="http://h:1", model="b"), tmp_path)
    assert set(first.files).isdisjoint(second.files)
    again = opencode.plan(LaunchTarget(url="http://h:1", model="a"), tmp_path)
    assert again.files == first.files


def test_loop_guard_is_a_provider_header(tmp_path: Path) -> None:
    _, config = _written(opencode.plan(LaunchTarget(url="http://h:1", model="m", loop_guard="off"), tmp_path).files)
    provider = config["provider"]
    assert isinstance(provider, dict)
    assert provider["exo"]["options"]["headers"] == {"X-Exo-Loop-Guard": "off"}
    _, plain = _written(opencode.plan(LaunchTarget(url="http://h:1", model="m"), tmp_path).files)
    assert "headers" not in json.dumps(plain)
