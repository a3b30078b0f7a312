"""Section 9: agent sessions. An opencode session (its captured system prompt form and real tool list) replayed for
3 turns, a captured Claude Code first request, a new session sharing the system prompt, 4 sessions whose turns
interleave, then a restart of the server and a new session again: cold, from memory, and (exo) from disk.

The `claude-code` scope replays only the captured Claude Code first request: cold, again at once, and after the
restart. It is the part a loaded 2-core machine can run on both systems in minutes (mlx_lm.server's cold
prefill of the opencode prompt alone takes many minutes there).

Each system is measured the same way over HTTP (chat completions, greedy, streamed); the Claude Code request is
sent in its chat-completions form (system blocks joined, its tools as functions), which both servers accept.
mlx_lm.server gets the float32 weights exo's runner serves on a Linux CPU (see `bench.raw_worker`).
"""

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx

from bench.machine import exo_commit
from bench.raw_baseline import running_raw_baseline
from bench.results import AgentSessionsScope, AgentSessionsSection, SessionPhase, SessionStep, StreamMeasurement
from bench.servers import RunningServer, running_exo, running_mlx_lm_server
from bench.stream_client import request_body, stream_chat
from exo.api.types.openai_chat import ChatMessage, ToolDefinition

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
OPENCODE_TOOLS = REPOSITORY_ROOT / "tests" / "fixtures" / "opencode" / "tools.json"
CLAUDE_CODE_REQUEST = REPOSITORY_ROOT / "tests" / "fixtures" / "clients" / "claude_code_first_turn.json"
TURNS = 3
INTERLEAVED_SESSIONS = 4
SNAPSHOTS_SETTLED_S = 3.0
"""The restart waits until exo's snapshot folder has not changed for this long (the runner writes while idle)."""
SNAPSHOTS_WAIT_S = 300.0

QUESTIONS = (
    "List the files in this project and say what each one is for.",
    "Where are the tests, and how do I run them?",
    "Explain what the main module does.",
    "Which dependencies does the project declare?",
    "How is the configuration loaded?",
    "Find where errors are logged.",
    "What does the README say about installing?",
    "Summarise the last change to the code.",
)
FOLLOW_UPS = ("Now show me the most important function.", "Thanks. What would you change first?")


def opencode_system_prompt() -> str:
    """The system message opencode 1.18 sends for a custom agent (its environment block included)."""
    return (
        "You are a coding agent.\n"
        "You are powered by the model named exo-model. The exact model ID is exo/exo-model\n"
        "Here is some useful information about the environment you are running in:\n"
        "<env>\n"
        "  Working directory: /home/user/project\n"
        "  Workspace root folder: /\n"
        "  Is directory a git repo: no\n"
        "  Platform: linux\n"
        "  Today's date: Thu Nov 26 2026\n"
        "</env>"
    )


def opencode_tools() -> list[ToolDefinition]:
    """opencode's real tools as it sends them (bash, edit, glob, grep, read, skill, task, todowrite, webfetch,
    write)."""
    return [ToolDefinition.model_validate(tool) for tool in json.loads(OPENCODE_TOOLS.read_text())]


def claude_code_request() -> tuple[list[ChatMessage], list[ToolDefinition]]:
    """The captured Claude Code first request (`claude -p`, its Write tool) in chat-completions form."""
    captured = json.loads(CLAUDE_CODE_REQUEST.read_text())
    system = "\n\n".join(block["text"] for block in captured["system"])
    user = "\n\n".join(block["text"] for block in captured["messages"][0]["content"])
    tools = [
        ToolDefinition.model_validate(
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool["description"],
                    "parameters": tool["input_schema"],
                },
            }
        )
        for tool in captured["tools"]
    ]
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)], tools


class _Replay:
    """Sends one system's requests and records each as a step."""

    def __init__(self, system: str, max_tokens: int) -> None:
        self._client: httpx.AsyncClient | None = None
        self._system = system
        self._max_tokens = max_tokens
        self._tools = opencode_tools()
        self.steps: list[SessionStep] = []
        self.conversations: dict[int, list[ChatMessage]] = {}

    def rebind(self, client: httpx.AsyncClient) -> None:
        """Send through `client` (one per server process)."""
        self._client = client

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("no client bound")
        return self._client

    async def turn(
        self, server: RunningServer, session: int, phase: SessionPhase, *, interleaved: bool = False
    ) -> SessionStep:
        """The session's next turn: its first question, or a follow-up after the answer it got last."""
        conversation = self.conversations.setdefault(
            session,
            [
                ChatMessage(role="system", content=opencode_system_prompt()),
                ChatMessage(role="user", content=QUESTIONS[session % len(QUESTIONS)]),
            ],
        )
        turn = sum(message.role == "user" for message in conversation)
        outcome = await stream_chat(
            self.client, server.base_url, request_body(conversation, self._tools, self._max_tokens)
        )
        # The answer as text (a call's arguments written out): the next turn resends it, as an agent does.
        reply = outcome.measurement.text or (
            f"{outcome.tool_call[0]}({outcome.tool_call[1]})" if outcome.tool_call else ""
        )
        conversation += [
            ChatMessage(role="assistant", content=reply),
            ChatMessage(role="user", content=FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)]),
        ]
        return self._record(
            "opencode",
            session=session,
            turn=turn,
            phase=phase,
            interleaved=interleaved,
            measurement=outcome.measurement,
        )

    async def claude_code(self, server: RunningServer, phase: SessionPhase) -> SessionStep:
        messages, tools = claude_code_request()
        outcome = await stream_chat(self.client, server.base_url, request_body(messages, tools, self._max_tokens))
        return self._record(
            "claude-code", session=0, turn=1, phase=phase, interleaved=False, measurement=outcome.measurement
        )

    def _record(
        self,
        workload: str,
        *,
        session: int,
        turn: int,
        phase: SessionPhase,
        interleaved: bool,
        measurement: StreamMeasurement,
    ) -> SessionStep:
        step = SessionStep(
            system=self._system,
            workload=workload,
            session=session,
            turn=turn,
            phase=phase,
            interleaved=interleaved,
            ttft_s=measurement.ttft_s,
            prompt_tokens=measurement.prompt_tokens,
            cached_tokens=measurement.cached_tokens,
        )
        self.steps.append(step)
        return step


async def _first_process(replay: _Replay, server: RunningServer, progress: Callable[[str], None]) -> None:
    """A session's turns (the first cold), Claude Code's first request, a new session, then 4 interleaved ones."""
    for turn in range(TURNS):
        step = await replay.turn(server, 0, "cold" if turn == 0 else "warm")
        progress(
            f"  opencode turn {step.turn}: TTFT {step.ttft_s:.1f} s, {step.cached_tokens}/{step.prompt_tokens} cached"
        )
    step = await replay.claude_code(server, "cold")
    progress(f"  claude-code: TTFT {step.ttft_s:.1f} s, {step.cached_tokens}/{step.prompt_tokens} cached")
    step = await replay.turn(server, 1, "warm")
    progress(f"  new session: TTFT {step.ttft_s:.1f} s, {step.cached_tokens}/{step.prompt_tokens} cached")
    sessions = range(2, 2 + INTERLEAVED_SESSIONS)
    for _ in range(TURNS):
        for session in sessions:
            await replay.turn(server, session, "warm", interleaved=True)
    later = [step for step in replay.steps if step.interleaved and step.turn > 1]
    progress(f"  interleaved: least cached share on a later turn {min(_share(step) for step in later):.0%}")


async def _after_restart(replay: _Replay, server: RunningServer, progress: Callable[[str], None]) -> None:
    step = await replay.turn(server, 2 + INTERLEAVED_SESSIONS, "restarted")
    progress(f"  new session after restart: TTFT {step.ttft_s:.1f} s, {step.cached_tokens} cached")
    step = await replay.claude_code(server, "restarted")
    progress(f"  claude-code after restart: TTFT {step.ttft_s:.1f} s, {step.cached_tokens} cached")


async def _claude_code_first_process(replay: _Replay, server: RunningServer, progress: Callable[[str], None]) -> None:
    """The `claude-code` scope: the captured first request cold, then the same request again."""
    for phase in ("cold", "warm"):
        step = await replay.claude_code(server, phase)
        progress(f"  claude-code {phase}: TTFT {step.ttft_s:.1f} s, {step.cached_tokens}/{step.prompt_tokens} cached")


async def _claude_code_after_restart(replay: _Replay, server: RunningServer, progress: Callable[[str], None]) -> None:
    step = await replay.claude_code(server, "restarted")
    progress(f"  claude-code after restart: TTFT {step.ttft_s:.1f} s, {step.cached_tokens} cached")


_Phase = Callable[[_Replay, RunningServer, Callable[[str], None]], Awaitable[None]]
_PHASES: dict[AgentSessionsScope, tuple[_Phase, _Phase]] = {
    "full": (_first_process, _after_restart),
    "claude-code": (_claude_code_first_process, _claude_code_after_restart),
}
"""Per scope: what the first server process is sent, then what the restarted one is sent."""


def _share(step: SessionStep) -> float:
    return step.cached_tokens / step.prompt_tokens if step.prompt_tokens else 0.0


def wait_for_snapshots(folder: Path) -> None:
    """Until exo's runner has written its snapshots (nothing changed in the folder for a few seconds)."""
    deadline = time.monotonic() + SNAPSHOTS_WAIT_S
    last: list[tuple[str, int]] = []
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        now = sorted((str(path), path.stat().st_size) for path in folder.rglob("*") if path.is_file())
        if now != last:
            last, stable_since = now, time.monotonic()
        elif now and time.monotonic() - stable_since >= SNAPSHOTS_SETTLED_S:
            return
        time.sleep(0.5)


def _replay_system(
    system: str,
    *,
    scope: AgentSessionsScope,
    start: Callable[[], AbstractContextManager[RunningServer]],
    max_tokens: int,
    progress: Callable[[str], None],
    between: Callable[[], None] = lambda: None,
) -> list[SessionStep]:
    first, restarted = _PHASES[scope]

    async def run(phase: _Phase) -> None:
        with start() as server:
            async with httpx.AsyncClient() as client:
                replay.rebind(client)
                await phase(replay, server, progress)
            if phase is first:
                between()

    replay = _Replay(system, max_tokens)
    progress(f"agent sessions on {system}: first process")
    asyncio.run(run(first))
    progress(f"agent sessions on {system}: restarted")
    asyncio.run(run(restarted))
    return replay.steps


def measure_agent_sessions(
    model_id: str,
    model_path: Path,
    work_dir: Path,
    max_tokens: int,
    progress: Callable[[str], None],
    *,
    scope: AgentSessionsScope = "full",
) -> AgentSessionsSection:
    """Replay the sessions on exo (one EXO_HOME kept over its restart), then on mlx_lm.server (given the float32
    weights exo's runner serves, written by the raw worker as in the server sections)."""
    home = work_dir / "agent-sessions-home"
    exo_steps = _replay_system(
        "exo",
        scope=scope,
        start=lambda: running_exo(model_path, work_dir, home=home),
        max_tokens=max_tokens,
        progress=progress,
        between=lambda: wait_for_snapshots(home / "prefix-cache"),
    )
    float32_copy = work_dir / "float32-model"
    progress("writing the float32 weights for mlx_lm.server")
    with running_raw_baseline(model_path, float32_copy):
        pass
    mlx_steps = _replay_system(
        "mlx_lm.server",
        scope=scope,
        start=lambda: running_mlx_lm_server(float32_copy, work_dir),
        max_tokens=max_tokens,
        progress=progress,
    )
    load_1, load_5, load_15 = os.getloadavg()
    return AgentSessionsSection(
        steps=[*exo_steps, *mlx_steps],
        model_id=model_id,
        max_tokens=max_tokens,
        load_average=(load_1, load_5, load_15),
        exo_commit=exo_commit(),
        scope=scope,
    )
