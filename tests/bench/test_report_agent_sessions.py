"""Section 9 renders the session steps (interleaved turns summarised) and judges the three targets from them."""

from bench.report_agent_sessions import AGENT_SESSIONS_TITLE, render_agent_sessions
from bench.results import AgentSessionsSection, SessionPhase, SessionStep


def _step(
    system: str,
    session: int,
    turn: int,
    phase: SessionPhase,
    *,
    ttft_s: float,
    cached: int,
    interleaved: bool = False,
    workload: str = "opencode",
) -> SessionStep:
    return SessionStep(
        system=system,
        workload=workload,
        session=session,
        turn=turn,
        phase=phase,
        interleaved=interleaved,
        ttft_s=ttft_s,
        prompt_tokens=1000,
        cached_tokens=cached,
    )


def _steps(system: str, restarted_ttft: float, interleaved_cached: int) -> list[SessionStep]:
    return [
        _step(system, 0, 1, "cold", ttft_s=100.0, cached=0),
        _step(system, 0, 2, "warm", ttft_s=5.0, cached=990),
        _step(system, 0, 3, "warm", ttft_s=12.0, cached=995),
        _step(system, 0, 1, "cold", ttft_s=3.0, cached=0, workload="claude-code"),
        _step(system, 1, 1, "warm", ttft_s=4.0, cached=950),
        _step(system, 2, 1, "warm", ttft_s=4.0, cached=950, interleaved=True),
        _step(system, 2, 2, "warm", ttft_s=2.0, cached=interleaved_cached, interleaved=True),
        _step(system, 3, 2, "warm", ttft_s=2.0, cached=995, interleaved=True),
        _step(system, 6, 1, "restarted", ttft_s=restarted_ttft, cached=950),
    ]


def test_rows_and_targets_per_system() -> None:
    section = AgentSessionsSection(
        steps=[*_steps("exo", 4.0, 990), *_steps("mlx_lm.server", 100.0, 800)],
        model_id="test-model",
        max_tokens=32,
        load_average=(2.0, 1.5, 1.0),
        exo_commit="abc1234",
    )

    text = "\n".join(render_agent_sessions(section))

    assert text.startswith(AGENT_SESSIONS_TITLE)
    assert "commit abc1234; load average (1, 5, 15 min) at the end 2.00, 1.50, 1.00" in text
    assert "| exo | opencode session, turn 2 | warm | 5.00 | 1000 | 990 (99%) |" in text
    assert "| exo | opencode, new session (same system prompt) | restarted | 4.00 | 1000 | 950 (95%) |" in text
    assert "| exo | Claude Code first request | cold | 3.00 | 1000 | 0 (0%) |" in text
    assert "interleaved" not in text.split("| System |")[1].split("\n- ")[0]  # summarised, not listed
    exo, mlx = (line for line in text.splitlines() if line.startswith("- "))
    assert "after a restart took 4.0% of the cold first turn's TTFT (target ≤ 10%: met)" in exo
    assert "turns 2+ took at most 12.0% of turn 1's (target ≤ 10%: **not met**)" in exo
    assert "2 later turns of 2 interleaved sessions had at least 99% of their prompt cached" in exo
    assert "(target ≥ 90%: met)" in exo
    assert "after a restart took 100.0% of the cold first turn's TTFT (target ≤ 10%: **not met**)" in mlx
    assert "at least 80% of their prompt cached (target ≥ 90%: **not met**)" in mlx


def test_claude_code_scope_judges_the_repeat_and_the_restart_against_cold() -> None:
    steps: list[SessionStep] = []
    for system, restarted_ttft, restarted_cached in (("exo", 2.0, 999), ("mlx_lm.server", 40.0, 0)):
        steps += [
            _step(system, 0, 1, "cold", ttft_s=40.0, cached=0, workload="claude-code"),
            _step(system, 0, 1, "warm", ttft_s=1.0, cached=999, workload="claude-code"),
            _step(system, 0, 1, "restarted", ttft_s=restarted_ttft, cached=restarted_cached, workload="claude-code"),
        ]
    section = AgentSessionsSection(
        steps=steps,
        model_id="test-model",
        max_tokens=32,
        load_average=(2.0, 1.5, 1.0),
        exo_commit="abc1234",
        scope="claude-code",
    )

    text = "\n".join(render_agent_sessions(section))

    assert "Only the captured Claude Code first request" in text
    assert "| mlx_lm.server | Claude Code first request | restarted | 40.00 | 1000 | 0 (0%) |" in text
    exo, mlx = (line for line in text.splitlines() if line.startswith("- "))
    assert exo == (
        "- exo: the same request again took 2.5% of the cold TTFT, after a restart 5.0% (999 of 1000 tokens cached)."
    )
    assert mlx.startswith("- mlx_lm.server: the same request again took 2.5% of the cold TTFT, after a restart 100.0%")
