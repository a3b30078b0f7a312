"""Render section 9, agent sessions cold, warm and after a restart, as Markdown, with its three targets."""

from statistics import median

from bench.markdown import markdown_table
from bench.results import AgentSessionsSection, SessionStep

AGENT_SESSIONS_TITLE = "## 9. Agent sessions: cold, warm and after a restart"
RESTART_TARGET = 0.10
"""A new session after a restart: TTFT at most this share of the cold first turn's."""
LATER_TURN_TARGET = 0.10
"""Turns 2 and 3 of a session: TTFT at most this share of its first turn's."""
INTERLEAVED_CACHED_TARGET = 0.90
"""Sessions whose turns interleave: at least this share of every later turn's prompt cached."""


def _share(step: SessionStep) -> float:
    return step.cached_tokens / step.prompt_tokens if step.prompt_tokens else 0.0


def _label(step: SessionStep) -> str:
    if step.workload == "claude-code":
        return "Claude Code first request"
    if step.session == 0:
        return f"opencode session, turn {step.turn}"
    return "opencode, new session (same system prompt)"


def _row(step: SessionStep) -> list[str]:
    return [
        step.system,
        _label(step),
        step.phase,
        f"{step.ttft_s:.2f}",
        str(step.prompt_tokens),
        f"{step.cached_tokens} ({_share(step):.0%})",
    ]


def _verdict(met: bool) -> str:
    return "met" if met else "**not met**"


def _targets(steps: list[SessionStep], system: str) -> list[str]:
    mine = [step for step in steps if step.system == system]
    first = next(step for step in mine if step.workload == "opencode" and step.session == 0 and step.turn == 1)
    later = [step for step in mine if step.workload == "opencode" and step.session == 0 and step.turn > 1]
    restarted = next(step for step in mine if step.workload == "opencode" and step.phase == "restarted")
    interleaved = [step for step in mine if step.interleaved and step.turn > 1]
    restart_ratio = restarted.ttft_s / first.ttft_s
    later_ratio = max(step.ttft_s for step in later) / first.ttft_s
    least_cached = min(_share(step) for step in interleaved)
    return [
        f"- {system}: a new session after a restart took {restart_ratio:.1%} of the cold first turn's TTFT "
        f"(target ≤ {RESTART_TARGET:.0%}: {_verdict(restart_ratio <= RESTART_TARGET)}); turns 2+ took at most "
        f"{later_ratio:.1%} of turn 1's (target ≤ {LATER_TURN_TARGET:.0%}: "
        f"{_verdict(later_ratio <= LATER_TURN_TARGET)}); {len(interleaved)} later turns of "
        f"{len({step.session for step in interleaved})} interleaved sessions had at least {least_cached:.0%} of "
        f"their prompt cached (target ≥ {INTERLEAVED_CACHED_TARGET:.0%}: "
        f"{_verdict(least_cached >= INTERLEAVED_CACHED_TARGET)}), median TTFT "
        f"{median(step.ttft_s for step in interleaved):.2f} s.",
    ]


def _claude_code_ratios(steps: list[SessionStep], system: str) -> list[str]:
    """The `claude-code` scope has no sessions to judge the targets on: the repeat and the restart against cold."""
    mine = {step.phase: step for step in steps if step.system == system}
    cold, warm, restarted = mine["cold"], mine["warm"], mine["restarted"]
    return [
        f"- {system}: the same request again took {warm.ttft_s / cold.ttft_s:.1%} of the cold TTFT, after a restart "
        f"{restarted.ttft_s / cold.ttft_s:.1%} ({restarted.cached_tokens} of {restarted.prompt_tokens} tokens cached)."
    ]


WORKLOADS = (
    "An opencode session (opencode 1.18's system prompt for a custom agent and its 10 real tools, "
    "`tests/fixtures/opencode/tools.json`) is replayed for 3 turns, each resending the conversation with the "
    "answer and a follow-up; then the captured Claude Code first request "
    "(`tests/fixtures/clients/claude_code_first_turn.json`: `claude -p` with a one-line system prompt and its "
    "Write tool, sent in chat-completions form); then a new opencode session; then 4 more sessions whose 3 turns "
    "interleave. The server is then stopped and started again (exo with the same `EXO_HOME`, after its runner "
    "wrote its prefix-cache snapshots) and a new session and the Claude Code request are sent again."
)
CLAUDE_CODE_ONLY = (
    "Only the captured Claude Code first request (`tests/fixtures/clients/claude_code_first_turn.json`: `claude -p` "
    "with a one-line system prompt and its Write tool, sent in chat-completions form; `--agent-sessions "
    "claude-code`): cold, the same request again, and after the server was stopped and started again (exo with the "
    "same `EXO_HOME`, after its runner wrote its prefix-cache snapshots). The opencode sessions were not replayed."
)


def render_agent_sessions(section: AgentSessionsSection) -> list[str]:
    """The section's Markdown lines."""
    load = ", ".join(f"{value:.2f}" for value in section.load_average)
    systems = list(dict.fromkeys(step.system for step in section.steps))
    shown = [step for step in section.steps if not step.interleaved]
    judged = _targets if section.scope == "full" else _claude_code_ratios
    return [
        AGENT_SESSIONS_TITLE,
        "",
        f"Measured at commit {section.exo_commit}; load average (1, 5, 15 min) at the end {load}.",
        "",
        f"{section.model_id}, greedy, up to {section.max_tokens} tokens per answer, streamed chat completions timed "
        "over HTTP (TTFT: request sent → first generated text). "
        + (WORKLOADS if section.scope == "full" else CLAUDE_CODE_ONLY)
        + " mlx_lm.server (given the float32 weights exo's runner serves) keeps prompt caches in memory only.",
        "",
        *markdown_table(
            ["System", "Request", "Phase", "TTFT s", "Prompt tokens", "Cached tokens"], [_row(step) for step in shown]
        ),
        *(line for system in systems for line in judged(section.steps, system)),
        "",
    ]
