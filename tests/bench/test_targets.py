"""Target verdicts follow the measured numbers, and unmeasurable speeds never count as met."""

from bench.results import AgentSeries, AgentTurn, DecodeRow
from bench.targets import (
    EXO_NO_TOOLS,
    EXO_TOOLS,
    MLX_LM_TOOLS,
    RAW,
    check_decode_vs_mlx_lm_server,
    check_decode_vs_raw,
    check_turn_ttft,
)


def _row(system: str, tokens_per_s: float | None) -> DecodeRow:
    return DecodeRow(
        system=system, ttft_s=1.0, decode_tokens_per_s=tokens_per_s, completion_tokens=96, prompt_tokens=50
    )


def test_exo_within_three_percent_of_raw_meets_the_decode_target() -> None:
    check = check_decode_vs_raw([_row(RAW, 10.0), _row(EXO_NO_TOOLS, 9.8)])
    assert check.met
    assert check.measured == "0.980×"


def test_exo_more_than_three_percent_slower_than_raw_misses_the_decode_target() -> None:
    assert not check_decode_vs_raw([_row(RAW, 10.0), _row(EXO_NO_TOOLS, 9.6)]).met


def test_an_unmeasurable_peer_speed_is_reported_as_missed_not_met() -> None:
    check = check_decode_vs_mlx_lm_server([_row(EXO_TOOLS, 6.0), _row(MLX_LM_TOOLS, None)])
    assert not check.met
    assert check.measured == "n/a"
    assert "at once" in check.why


def _series(ttfts: list[float], cached: list[int]) -> AgentSeries:
    turns = [
        AgentTurn(turn=number, prompt_tokens=3000 + 100 * number, cached_tokens=hits, ttft_s=ttft)
        for number, (ttft, hits) in enumerate(zip(ttfts, cached, strict=True), start=1)
    ]
    return AgentSeries(system="exo", turns=turns)


def test_turn_target_judges_the_slowest_later_turn() -> None:
    met = check_turn_ttft(_series([20.0, 1.0, 2.9, 1.5], [0, 3000, 3100, 3200]))
    missed = check_turn_ttft(_series([20.0, 1.0, 3.1, 1.5], [0, 3000, 3100, 3200]))
    assert met.met
    assert not missed.met
    assert "turn 3" in missed.measured


def test_turn_target_miss_without_cache_hits_says_nothing_was_reused() -> None:
    check = check_turn_ttft(_series([20.0, 19.0, 19.5, 20.5], [0, 0, 0, 0]))
    assert not check.met
    assert "reused nothing" in check.why
