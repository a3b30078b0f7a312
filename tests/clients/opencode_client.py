"""Run the real opencode CLI (npm package `opencode-ai`, pinned in .ci/npm-clients) headless against an exo node.

opencode is isolated from the machine it runs on: HOME and the XDG folders point into a temporary folder, and the
update check, models.dev fetch, session sharing, LSP downloads and Claude Code prompt import are switched off, so a
run talks to nothing but exo (its background install of `@opencode-ai/plugin` into the temporary config folder may
still try the npm registry; offline it fails without holding the run up).
"""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from tests.clients.headless import HeadlessOutput, run_headless
from tests.fixtures.fixture_specs import JsonObject

PROVIDER_ID: Final = "exo"
# Switches that keep opencode from reaching the network for anything but the model (names from opencode 1.18).
OFFLINE_SWITCHES: Final = (
    "OPENCODE_DISABLE_AUTOUPDATE",
    "OPENCODE_DISABLE_MODELS_FETCH",
    "OPENCODE_DISABLE_SHARE",
    "OPENCODE_DISABLE_LSP_DOWNLOAD",
    "OPENCODE_DISABLE_CLAUDE_CODE",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS",
)


class OpencodeEvent(BaseModel):
    """One line of `opencode run --format json`: `type` is step_start, text, tool_use, step_finish or error."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str
    part: dict[str, JsonValue] = {}
    error: JsonValue = None


class OpencodeRun(BaseModel):
    """What one `opencode run` did: its exit status, parsed events and raw output (for failure messages)."""

    model_config = ConfigDict(frozen=True)

    returncode: int
    events: tuple[OpencodeEvent, ...]
    stdout: str
    stderr: str

    def texts(self) -> list[str]:
        """The assistant text parts, in order."""
        return [str(event.part.get("text", "")) for event in self.events if event.type == "text"]

    def tool_parts(self, tool: str) -> list[dict[str, JsonValue]]:
        """The tool parts (name, call id, state with input/output/status) opencode ran for `tool`."""
        return [event.part for event in self.events if event.type == "tool_use" and event.part.get("tool") == tool]

    def describe(self) -> str:
        """Everything a failing assertion should show."""
        return f"opencode exited {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr (tail)\n{self.stderr[-6000:]}"


def provider_config(
    base_url: str,
    model_id: str,
    context_tokens: int,
    output_tokens: int,
    *,
    agent_prompt: str | None = None,
    disabled_tools: Sequence[str] = (),
    provider_options: JsonObject | None = None,
) -> JsonObject:
    """An opencode.json that routes `exo/<model_id>` to exo's OpenAI-compatible API at `base_url` (ending in /v1).

    File edits are allowed up front because a headless run cannot answer a permission prompt; the title agent is
    disabled so a run makes only the requests of the conversation itself. `agent_prompt` replaces the build agent's
    system prompt and `disabled_tools` switches tools off (opencode still sends its environment block and the tools
    left on, each with its full description and schema). `provider_options` adds to the provider's options (such as
    its `headerTimeout`).
    """
    build_agent: JsonObject = {} if agent_prompt is None else {"build": {"prompt": agent_prompt}}
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"edit": "allow"},
        "agent": {"title": {"disable": True}, **build_agent},
        "tools": dict.fromkeys(disabled_tools, False),
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "exo",
                "options": {"baseURL": base_url, **(provider_options or {})},
                "models": {
                    model_id: {
                        "name": model_id,
                        "tool_call": True,
                        "limit": {"context": context_tokens, "output": output_tokens},
                    }
                },
            }
        },
    }


def isolated_environment(home: Path) -> dict[str, str]:
    """The process environment with HOME/XDG folders under `home` and opencode's network extras switched off."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENCODE", "XDG_")) and key not in {"OPENAI_API_KEY", "OPENAI_BASE_URL"}
    }
    environment |= {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "NO_COLOR": "1",
    }
    environment |= dict.fromkeys(OFFLINE_SWITCHES, "1")
    return environment


def run_opencode(
    binary: Path, project: Path, home: Path, model_id: str, prompt_words: Sequence[str], *, timeout: float
) -> OpencodeRun:
    """`opencode run --format json --model exo/<model_id> <words…>` in `project`, killed after `timeout` seconds.

    The prompt goes in as separate words: opencode wraps a single argument that contains spaces in quotes before
    sending it, which would change the user message the model sees.
    """
    arguments = [str(binary), "run", "--format", "json", "--print-logs", "--model", f"{PROVIDER_ID}/{model_id}"]
    # opencode takes its session folder from $PWD, which an inherited environment points at pytest's folder.
    return parsed_run(run_headless([*arguments, *prompt_words], project, isolated_environment(home), timeout))


def parsed_run(output: HeadlessOutput) -> OpencodeRun:
    """What `opencode run --format json` printed, as events."""
    return OpencodeRun(
        returncode=output.returncode, events=_events(output.stdout), stdout=output.stdout, stderr=output.stderr
    )


def _events(stdout: str) -> tuple[OpencodeEvent, ...]:
    events: list[OpencodeEvent] = []
    for line in stdout.splitlines():
        try:
            events.append(OpencodeEvent.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError):
            continue  # opencode may print non-event lines (warnings); the raw stdout stays in the run for debugging
    return tuple(events)
