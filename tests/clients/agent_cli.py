"""Run the real Claude Code and Codex CLIs headless against an exo node, isolated from the machine they run on.

Both are npm packages that `.ci/install-clients` installs (see installed.py), at the versions the captured requests
in tests/fixtures/clients come from. Each run gets its own HOME (and CODEX_HOME), a fixed time zone and shell (they
appear in the prompt), no credentials but a dummy key, and every update check or telemetry switch off, so it talks
to nothing but exo. Both print one JSON event per line, parsed into `CliRun`.
"""

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, JsonValue

from exo.conformance.json_view import JsonMapping, as_list, as_object
from tests.clients.headless import run_headless
from tests.fixtures.client_requests import CLIENT_AGENT_PROMPT, CODEX_CONFIG

# Values the prompts contain; fixed so that a run on any machine sends what the fixture model was trained on.
_STABLE_ENVIRONMENT: Final = {"TZ": "Etc/UTC", "SHELL": "/bin/bash", "NO_COLOR": "1"}
# Variables of the machine that would point the clients elsewhere or change their prompt.
_FOREIGN_PREFIXES: Final = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "XDG_")
# Linux's limit on one argument's length (MAX_ARG_STRLEN, 32 pages), less room for the terminating NUL.
LONGEST_ARGUMENT_BYTES: Final = 128 * 1024 - 1


class CliRun(BaseModel):
    """What one headless run did: its exit status, parsed JSON events and raw output (for failure messages)."""

    model_config = ConfigDict(frozen=True)

    returncode: int
    events: tuple[dict[str, JsonValue], ...]
    stdout: str
    stderr: str

    def of_type(self, kind: str) -> list[dict[str, JsonValue]]:
        return [event for event in self.events if event.get("type") == kind]

    def claude_tool_uses(self) -> list[tuple[object, object]]:
        """(name, input) of every tool_use block in Claude Code's `assistant` events."""
        uses: list[tuple[object, object]] = []
        for event in self.of_type("assistant"):
            for raw in as_list((as_object(event.get("message")) or {}).get("content")) or []:
                block = as_object(raw) or {}
                if block.get("type") == "tool_use":
                    uses.append((block.get("name"), block.get("input")))
        return uses

    def codex_items(self, kind: str) -> list[JsonMapping]:
        """The items of Codex's `item.completed` events of type `kind` (command_execution, agent_message…)."""
        items = [as_object(event.get("item")) or {} for event in self.of_type("item.completed")]
        return [item for item in items if item.get("type") == kind]

    def describe(self) -> str:
        """Everything a failing assertion should show."""
        return f"exited {self.returncode}\n--- stdout\n{self.stdout[-8000:]}\n--- stderr (tail)\n{self.stderr[-4000:]}"


def isolated_environment(home: Path, extra: dict[str, str]) -> dict[str, str]:
    """This process's environment minus anything pointing a client elsewhere, with HOME under `home`."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith(_FOREIGN_PREFIXES)}
    return environment | _STABLE_ENVIRONMENT | {"HOME": str(home)} | extra


def run_cli(
    arguments: Sequence[str],
    project: Path,
    environment: dict[str, str],
    timeout: float,
    stdin_text: str | None = None,
    *,
    stop_when: Callable[[], bool] | None = None,
) -> CliRun:
    output = run_headless(arguments, project, environment, timeout, stdin_text, stop_when=stop_when)
    events: list[dict[str, JsonValue]] = []
    for line in output.stdout.splitlines():
        try:
            decoded: object = json.loads(line)
        except json.JSONDecodeError:
            continue  # a warning line; the raw stdout stays in the run for debugging
        if isinstance(decoded, dict):
            events.append(decoded)  # pyright: ignore[reportUnknownArgumentType]
    return CliRun(returncode=output.returncode, events=tuple(events), stdout=output.stdout, stderr=output.stderr)


def run_claude_code(
    binary: Path,
    project: Path,
    home: Path,
    *,
    base_url: str,
    model: str,
    prompt: str,
    timeout: float,
    environment: Mapping[str, str] | None = None,
    extra_arguments: Sequence[str] = (),
) -> CliRun:
    """`claude -p <prompt>` with a one-line system prompt and only the Write tool, edits allowed, against exo.

    ANTHROPIC_BASE_URL is exo's root (Claude Code appends /v1/messages); the attribution header is switched off as
    docs/AGENTS.md recommends (exo drops it anyway). `environment` adds settings (such as API_TIMEOUT_MS),
    `extra_arguments` options (such as --include-partial-messages).
    """
    environment = isolated_environment(
        home,
        {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "unused",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            **(environment or {}),
        },
    )
    # Linux refuses a single argument over 128 KiB (E2BIG); `claude -p` reads a longer prompt from stdin instead.
    in_argument = len(prompt.encode()) < LONGEST_ARGUMENT_BYTES
    arguments = [
        str(binary),
        "-p",
        *([prompt] if in_argument else []),
        "--system-prompt",
        CLIENT_AGENT_PROMPT,
        "--tools",
        "Write",
        "--permission-mode",
        "acceptEdits",
        "--model",
        model,
        "--output-format",
        "stream-json",
        "--verbose",
        *extra_arguments,
    ]
    return run_cli(arguments, project, environment, timeout, None if in_argument else prompt)


def codex_config(base_url: str, model: str, instructions: Path, stream_idle_timeout_ms: int | None = None) -> str:
    """Codex CLI's config.toml: exo as a Responses API provider (`base_url` ends in /v1), trimmed as in the test;
    `stream_idle_timeout_ms` replaces Codex's 5-minute wait for the next SSE event."""
    idle = f"stream_idle_timeout_ms = {stream_idle_timeout_ms}\n" if stream_idle_timeout_ms is not None else ""
    return (
        f'model = "{model}"\nmodel_provider = "exo"\n'
        + CODEX_CONFIG.replace('"instructions.md"', json.dumps(str(instructions)))
        + f'\n[model_providers.exo]\nname = "exo"\nbase_url = "{base_url}"\nwire_api = "responses"\n{idle}'
    )


def run_codex(
    binary: Path,
    project: Path,
    home: Path,
    *,
    base_url: str,
    model: str,
    prompt: str,
    timeout: float,
    stream_idle_timeout_ms: int | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> CliRun:
    """`codex exec --json <prompt>` against exo, its sandbox off (the project is a throwaway test folder); stopped
    after `timeout` s or once `stop_when` says so."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    instructions = codex_home / "instructions.md"
    instructions.write_text(CLIENT_AGENT_PROMPT)
    (codex_home / "config.toml").write_text(codex_config(base_url, model, instructions, stream_idle_timeout_ms))
    environment = isolated_environment(home, {"CODEX_HOME": str(codex_home)})
    # Linux refuses a single argument over 128 KiB (E2BIG); `codex exec -` reads a longer prompt from stdin.
    in_argument = len(prompt.encode()) < LONGEST_ARGUMENT_BYTES
    arguments = [
        str(binary),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        prompt if in_argument else "-",
    ]
    return run_cli(arguments, project, environment, timeout, None if in_argument else prompt, stop_when=stop_when)
