"""Extension processes: tools registered over line-JSON, checked at registration, called with a time limit.

Each test runs a real subprocess: the shipped weather extension, or a small misbehaving extension written for the
test (wedged, dying, chatty, slow). Whatever the extension does, the agent starts and every call ends in a result.
"""

import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from textwrap import dedent

import pytest

from examples.agent_tools.discovery import discovered_tools
from examples.agent_tools.extension import (
    DEFAULT_CALL_TIMEOUT_SECONDS,
    DEFAULT_READY_GRACE_SECONDS,
    Extension,
    ExtensionExitedError,
)
from examples.agent_tools.registry import ToolError, ToolRegistry
from examples.extensions.weather_extension import SKIES, forecast
from examples.tool_calling_example import build_parser

WEATHER_EXTENSION = Path(__file__).resolve().parents[2] / "examples" / "extensions" / "weather_extension.py"
WEATHER_COMMAND = shlex.join([sys.executable, str(WEATHER_EXTENSION)])
ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
# The start of every test extension: send() writes one protocol line, calls() yields the agent's tool calls.
PRELUDE = f"""\
import json, sys, time
def send(message):
    print(json.dumps(message), flush=True)
def register(name, schema, description="a test tool"):
    send({{"type": "register_tool", "name": name, "description": description, "schema": schema}})
def calls():
    for line in sys.stdin:
        yield json.loads(line)
def reply(call, content, is_error=False):
    send({{"type": "tool_result", "id": call["id"], "content": content, "is_error": is_error}})
ECHO_SCHEMA = json.loads({json.dumps(ECHO_SCHEMA)!r})
"""


def extension_command(tmp_path: Path, name: str, body: str) -> str:
    """Write a test extension called `name` and return the command line that starts it."""
    script = tmp_path / f"{name}.py"
    script.write_text(PRELUDE + dedent(body))
    return shlex.join([sys.executable, str(script)])


@pytest.fixture
def weather() -> Iterator[ToolRegistry]:
    with discovered_tools(ToolRegistry(), extensions=[WEATHER_COMMAND]) as registry:
        yield registry


def error_of(result: str) -> ToolError:
    return ToolError.model_validate_json(result)


def test_the_weather_extension_registers_its_tool_and_answers_from_a_hash_of_the_city(
    weather: ToolRegistry,
) -> None:
    assert weather.names() == ["get_weather"]
    paris = weather.run("get_weather", '{"city": "Paris"}')
    assert paris.ok, paris.result
    assert json.loads(paris.result) == forecast("Paris")
    assert json.loads(weather.run("get_weather", '{"city": " paris "}').result)["sky"] == forecast("Paris")["sky"]
    skies = {forecast(city)["sky"] for city in ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Rome")}
    assert len(skies) > 1
    assert skies <= set(SKIES)


def test_the_weather_is_the_same_in_a_fresh_extension_process(weather: ToolRegistry) -> None:
    first = weather.run("get_weather", '{"city": "Tokyo"}').result
    with discovered_tools(ToolRegistry(), extensions=[WEATHER_COMMAND]) as again:
        assert again.run("get_weather", '{"city": "Tokyo"}').result == first


def test_arguments_that_break_the_declared_schema_are_an_error_for_the_model(weather: ToolRegistry) -> None:
    run = weather.run("get_weather", '{"city": 5}')
    error = error_of(run.result)
    assert (run.ok, error.error) == (False, "invalid_arguments")
    assert "city: 5 is not of type 'string'" in error.message
    assert error_of(weather.run("get_weather", "{}").result).message.startswith("arguments: 'city' is a required")
    assert error_of(weather.run("get_weather", '{"city": ').result).error == "invalid_arguments"


def test_the_extensions_own_error_result_reaches_the_model_as_a_tool_failure(weather: ToolRegistry) -> None:
    run = weather.run("get_weather", '{"city": "  "}')
    assert (run.ok, error_of(run.result)) == (
        False,
        ToolError(error="tool_failed", message="'city' must be a non-empty string"),
    )


def test_bad_declarations_are_skipped_with_a_log_line_and_the_good_tool_still_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    command = extension_command(
        tmp_path,
        "mixed",
        """
        register("not_an_object", {"type": "string"})
        register("broken_schema", {"type": "object", "properties": 5})
        register("has a space", ECHO_SCHEMA)
        send({"type": "register_tool", "name": "schema_is_a_number", "description": "", "schema": 7})
        send({"type": "register_tool", "name": "no_schema"})
        register("echo", ECHO_SCHEMA)
        register("echo", {"type": "object"}, "a second echo")
        send({"type": "ready"})
        for call in calls():
            reply(call, call["args"]["text"])
        """,
    )
    with caplog.at_level(logging.WARNING), discovered_tools(ToolRegistry(), extensions=[command]) as registry:
        assert registry.names() == ["echo"]
        assert registry.run("echo", '{"text": "hi"}').result == "hi"
    skipped = " ".join(record.getMessage() for record in caplog.records)
    assert "skipping tool 'not_an_object' from extension mixed: its schema must describe an object" in skipped
    assert "skipping tool 'broken_schema' from extension mixed: its schema is not valid JSON Schema" in skipped
    assert "skipping tool 'has a space'" in skipped
    assert "skipping tool 'schema_is_a_number' from extension mixed: its schema must be a JSON object" in skipped
    assert "skipping tool 'echo' from extension mixed: a tool of that name is already registered" in skipped
    assert "ignoring a line that is not a protocol message" in skipped  # the registration without a schema


def test_an_extension_that_never_says_ready_costs_only_the_grace_period(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    command = extension_command(
        tmp_path,
        "wedged",
        """
        register("echo", ECHO_SCHEMA)
        time.sleep(600)
        """,
    )
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING),
        discovered_tools(
            ToolRegistry(), extensions=[command], ready_grace_seconds=1.0, call_timeout_seconds=1.0
        ) as registry,
    ):
        waited = time.monotonic() - started
        assert registry.names() == ["echo"]
        run = registry.run("echo", '{"text": "hi"}')  # registered, but the extension never reads its calls
    assert 1.0 <= waited < 15, waited
    assert error_of(run.result) == ToolError(
        error="timeout", message="echo (extension wedged) did not answer within 1s"
    )
    assert "extension wedged sent no 'ready' within 1s; going on with the 1 tools it registered" in caplog.text


def test_a_call_that_outlives_its_time_limit_is_a_timeout_result_and_the_next_call_still_works(
    tmp_path: Path,
) -> None:
    command = extension_command(
        tmp_path,
        "slow_once",
        """
        register("echo", ECHO_SCHEMA)
        send({"type": "ready"})
        for call in calls():
            if call["args"]["text"] == "slow":
                continue  # never answered
            reply(call, call["args"]["text"])
        """,
    )
    with discovered_tools(ToolRegistry(), extensions=[command], call_timeout_seconds=1.0) as registry:
        started = time.monotonic()
        slow = registry.run("echo", '{"text": "slow"}')
        assert time.monotonic() - started < 15
        assert error_of(slow.result).error == "timeout"
        assert registry.run("echo", '{"text": "fast"}').result == "fast"


def test_an_extension_that_dies_mid_call_fails_that_call_and_every_later_one(tmp_path: Path) -> None:
    command = extension_command(
        tmp_path,
        "crashy",
        """
        register("echo", ECHO_SCHEMA)
        send({"type": "ready"})
        for call in calls():
            sys.exit(3)
        """,
    )
    with discovered_tools(ToolRegistry(), extensions=[command]) as registry:
        first = error_of(registry.run("echo", '{"text": "hi"}').result)
        second = error_of(registry.run("echo", '{"text": "again"}').result)
    assert first == ToolError(error="tool_failed", message="ExtensionExitedError: extension crashy exited with code 3")
    assert second.error == "tool_failed"
    assert "crashy" in second.message


def test_noise_and_stray_results_are_logged_and_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    command = extension_command(
        tmp_path,
        "chatty",
        """
        print("starting up...", flush=True)
        register("echo", ECHO_SCHEMA)
        send({"type": "ready"})
        register("late", ECHO_SCHEMA)
        for call in calls():
            send({"type": "tool_result", "id": "no-such-call", "content": "stray"})
            print("{not json", flush=True)
            reply(call, {"echoed": call["args"]["text"]})
        """,
    )
    with caplog.at_level(logging.WARNING), discovered_tools(ToolRegistry(), extensions=[command]) as registry:
        assert registry.names() == ["echo"]
        run = registry.run("echo", '{"text": "hi"}')
    assert (run.ok, json.loads(run.result)) == (True, {"echoed": "hi"})  # non-string content arrives as JSON
    assert "ignoring a line that is not a protocol message" in caplog.text
    assert "answered unknown or expired call 'no-such-call'" in caplog.text
    assert "extension chatty registered 'late' after start-up; ignored" in caplog.text


def test_an_extension_that_cannot_start_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.WARNING),
        discovered_tools(ToolRegistry(), extensions=["/nonexistent/extension --flag", ""]) as registry,
    ):
        assert registry.names() == []
    assert "skipping extension '/nonexistent/extension --flag': cannot start it" in caplog.text


def test_an_extension_is_stopped_when_the_agent_is_done(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    command = extension_command(
        tmp_path,
        "lingering",
        f"""
        import os
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        register("echo", ECHO_SCHEMA)
        send({{"type": "ready"}})
        for call in calls():
            reply(call, "ok")
        time.sleep(600)  # ignores stdin closing: the agent must kill it
        """,
    )
    extension = Extension(shlex.split(command))
    assert [tool.name for tool in extension.tools()] == ["echo"]
    assert extension.call("echo", {"text": "x"}).text == "ok"
    extension.close()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    with pytest.raises(ExtensionExitedError, match="lingering"):
        extension.call("echo", {"text": "after close"})


def test_the_command_line_defaults_are_a_60_second_call_limit_and_a_5_second_ready_grace() -> None:
    assert (DEFAULT_CALL_TIMEOUT_SECONDS, DEFAULT_READY_GRACE_SECONDS) == (60.0, 5.0)
    defaults = build_parser().parse_args([])
    assert (defaults.remote_tool_timeout, defaults.ready_grace) == (60.0, 5.0)
    assert build_parser().parse_args(["--tools"]).tools == []
