"""Target verdicts follow the measured numbers, and unmeasurable speeds never count as met."""

from bench.results import AgentSeries, AgentTurn, DecodeRow, ParserCost
from bench.targets import (
    EXO_NO_TOOLS,
    EXO_TOOLS,
    MLX_LM_NO_TOOLS,
    MLX_LM_TOOLS,
    RAW,
    check_decode_vs_mlx_lm_server,
    check_decode_vs_raw,
    check_parser_cost,
    check_turn_ttft,
)
from tests.bench.test_render import sample_report


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


def test_exo_faster_than_the_loop_it_runs_is_flagged_as_load_noise() -> None:
    check = check_decode_vs_raw([_row(RAW, 2.0), _row(EXO_NO_TOOLS, 3.0)])
    assert check.met
    assert "uneven load" in check.why


def test_a_with_tools_gap_states_no_cause_it_did_not_measure() -> None:
    led = [_row(EXO_NO_TOOLS, 3.0), _row(MLX_LM_NO_TOOLS, 2.5), _row(EXO_TOOLS, 2.7), _row(MLX_LM_TOOLS, 3.4)]
    trailed = [_row(EXO_NO_TOOLS, 2.0), _row(MLX_LM_NO_TOOLS, 2.5), _row(EXO_TOOLS, 2.7), _row(MLX_LM_TOOLS, 3.4)]
    why = check_decode_vs_mlx_lm_server(led).why
    assert "this run measured no cause for the gap with tools" in why
    assert "noise" not in why
    assert "streaming path" in check_decode_vs_mlx_lm_server(trailed).why


def _parser(microseconds: tuple[float, float], examined: tuple[float, float]) -> list[ParserCost]:
    return [
        ParserCost(argument_bytes=size, segments=size // 4, microseconds_per_segment=time, chars_examined_per_char=work)
        for size, time, work in zip((1_000, 100_000), microseconds, examined, strict=True)
    ]


def test_parser_time_gap_with_flat_work_is_a_miss_blamed_on_load_not_on_the_parser() -> None:
    report = sample_report(load_1=0.2).model_copy(update={"parser": _parser((2.8, 7.4), (3.0, 3.1))})
    check = check_parser_cost(report)
    assert not check.met
    assert "work meter is flat" in check.why


def test_parser_work_growing_with_size_is_named_as_the_cause() -> None:
    report = sample_report(load_1=0.2).model_copy(update={"parser": _parser((2.8, 9.0), (3.0, 30.0))})
    assert "grows with the call" in check_parser_cost(report).why
