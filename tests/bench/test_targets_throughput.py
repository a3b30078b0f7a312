"""Issue #13's verdicts: concurrency scaling and parity with mlx_lm.server, speculation speed-up and free-text cost."""

from bench.results import ConcurrencyRow, DecodeRow, SpeculationReport, SpeculationRow, SpeculationSettings
from bench.targets import EXO_NO_TOOLS, RAW, check_decode_vs_raw
from bench.targets_throughput import (
    check_concurrency_scaling,
    check_concurrency_vs_peer,
    check_speculation_edit,
    check_speculation_free_text,
    workload_ceiling,
)


def _level(system: str, streams: int, aggregate: float) -> ConcurrencyRow:
    return ConcurrencyRow(
        system=system, streams=streams, aggregate_tokens_per_s=aggregate, per_stream_tokens_per_s=1.0, mean_ttft_s=1.0
    )


def test_four_streams_at_two_and_a_half_times_one_meet_the_scaling_target() -> None:
    check = check_concurrency_scaling([_level("exo", 1, 4.0), _level("exo", 4, 10.0)])
    assert check is not None
    assert check.met
    assert check.measured == "2.500×"


def test_a_scaling_miss_is_set_beside_how_the_peer_scaled_on_the_same_machine() -> None:
    rows = [
        _level("exo", 1, 4.0),
        _level("exo", 4, 8.0),
        _level("mlx_lm.server", 1, 4.0),
        _level("mlx_lm.server", 4, 6.0),
    ]
    check = check_concurrency_scaling(rows)
    assert check is not None
    assert not check.met
    assert "mlx_lm.server" in check.why
    assert "1.50×" in check.why
    assert "at most" not in check.why  # no batched-step costs measured: no ceiling claimed


def test_a_scaling_miss_states_the_ceiling_the_measured_batched_step_costs_allow() -> None:
    rows = [_level("exo", 1, 4.0), _level("exo", 4, 7.0)]
    check = check_concurrency_scaling(rows, {1: 0.1, 2: 0.12, 4: 0.2})
    assert check is not None
    assert not check.met
    assert "in bare mlx-lm 2.00×" in check.why
    assert "at most 2.00×" in check.why
    assert "below the target" in check.why
    check = check_concurrency_scaling(rows, {1: 0.1, 4: 0.12})
    assert check is not None
    assert "at most 3.33×" in check.why
    assert "exo's own scheduling" in check.why


def test_a_scaling_miss_takes_exo_s_ceiling_from_the_steps_through_its_matmul_plan() -> None:
    rows = [_level("exo", 1, 4.0), _level("exo", 4, 7.0)]

    check = check_concurrency_scaling(rows, {1: 0.1, 4: 0.2}, {1: 0.08, 4: 0.12})

    assert check is not None
    assert "in bare mlx-lm 2.00× and through exo's matmul plan 1.50×" in check.why
    assert "can give exo at most 2.67×" in check.why
    assert "exo's own scheduling" in check.why


def test_the_workload_ceiling_counts_the_prefill_as_measured_then_the_batched_step_costs() -> None:
    # One stream: 11 tokens at 10 tok/s is 1.1 s, 0.1 s of it to the first token, so 0.1 s per later token.
    one = _level("exo", 1, 10.0).model_copy(update={"mean_ttft_s": 0.1})
    # Four prompts prefilled together took 0.3 s; a step over 4 sequences costs 2x one.
    four = _level("exo", 4, 20.0).model_copy(update={"mean_ttft_s": 0.3})

    ceiling = workload_ceiling(one, four, 11, {1: 0.1, 4: 0.2})

    assert ceiling is not None
    assert abs(ceiling - 4 * 1.1 / (0.3 + 10 * 0.1 * 2)) < 1e-9
    check = check_concurrency_scaling([one, four], planned_batch_pass_seconds={1: 0.1, 4: 0.2}, tokens_per_stream=11)
    assert check is not None
    assert f"the ceiling for this workload is {ceiling:.2f}×" in check.why
    assert f"exo reached {2.0 / ceiling:.0%} of it" in check.why
    # 2.5x means 4 x 1.1 / 2.5 = 1.76 s in all: 1.46 s after the prefill, for 10 steps of 0.1 s at 1.46x one.
    assert "a step over 4 sequences costing at most 1.46× one" in check.why


def test_parity_with_the_peer_is_judged_at_the_worst_stream_count() -> None:
    rows = [_level("exo", streams, speed) for streams, speed in ((1, 5.0), (2, 9.0), (4, 14.0))]
    rows += [_level("mlx_lm.server", streams, speed) for streams, speed in ((1, 4.9), (2, 9.5), (4, 12.0))]
    check = check_concurrency_vs_peer(rows)
    assert check is not None
    assert not check.met
    assert check.measured.endswith("(2 streams)")
    assert "do not overlap (exo 9.00–9.00, mlx_lm.server 9.50–9.50" in check.why
    assert check_concurrency_vs_peer(rows[:3]) is None  # no peer rows: nothing to judge


def _row(workload: str, mode: str, speed: float, drafted: int = 0, accepted: int = 0) -> SpeculationRow:
    return SpeculationRow(
        workload=workload,
        mode=mode,
        tokens_per_s=[speed],
        median_tokens_per_s=speed,
        completion_tokens=100,
        drafted=drafted,
        accepted=accepted,
        forward_passes=100,
        same_tokens_as_off=True,
        text="",
    )


def _section(edit_on: float, free_on: float) -> SpeculationReport:
    rows = [
        _row("opencode edit", "off", 4.0),
        _row("opencode edit", "on (default)", edit_on, 120, 90),
        _row("opencode edit", "every draft verified", 5.0, 150, 95),
        _row("free text", "off", 4.0),
        _row("free text", "on (default)", free_on, 10, 2),
    ]
    return SpeculationReport(
        settings=SpeculationSettings(max_tokens=128, repeats=1),
        prompt_tokens={"opencode edit": 900, "free text": 60},
        rows=rows,
        pass_cost_ratios={1: 1.0, 4: 1.6},
        load_average=(1.0, 1.0, 1.0),
        exo_commit="abc1234",
    )


def test_speculation_meets_its_targets_at_one_and_a_half_times_on_edits_and_three_percent_on_free_text() -> None:
    section = _section(edit_on=6.0, free_on=3.88)
    edit, free_text = check_speculation_edit(section), check_speculation_free_text(section)
    assert edit is not None
    assert edit.met
    assert "90/120 draft tokens accepted" in edit.why
    assert free_text is not None
    assert free_text.met


def test_a_speculation_miss_shows_the_every_draft_mode_and_the_measured_pass_costs() -> None:
    section = _section(edit_on=5.2, free_on=3.8)
    edit, free_text = check_speculation_edit(section), check_speculation_free_text(section)
    assert edit is not None
    assert not edit.met
    assert "Verifying every draft gave 1.25×" in edit.why
    assert "4 tokens 1.60×" in edit.why
    assert free_text is not None
    assert not free_text.met


def test_the_edit_verdict_adds_the_file_rewrite_where_it_was_measured() -> None:
    section = _section(edit_on=5.2, free_on=3.9)
    without = check_speculation_edit(section)
    assert without is not None
    assert "file rewrite" not in without.why
    rewrite = [_row("file rewrite", "off", 4.0), _row("file rewrite", "on (default)", 9.0, 200, 180)]
    edit = check_speculation_edit(section.model_copy(update={"rows": [*section.rows, *rewrite]}))
    assert edit is not None
    assert (
        "On the file rewrite, where the reply copies the file, speculation gave 2.250× (180/200 draft tokens"
        in edit.why
    )


def test_the_edit_verdict_adds_what_other_models_measured_but_judges_the_report_model() -> None:
    section = _section(edit_on=5.2, free_on=3.9)
    other = _section(edit_on=7.0, free_on=4.0).model_copy(update={"model_id": "bigger-coder"})
    edit = check_speculation_edit(section, [other])
    assert edit is not None
    assert not edit.met
    assert edit.measured == "1.300×"
    assert "On bigger-coder the same edit gave 1.750× (90/120 draft tokens accepted" in edit.why


def _decode(system: str, runs: list[float | None]) -> DecodeRow:
    best = max(run for run in runs if run is not None)
    return DecodeRow(
        system=system, ttft_s=1.0, decode_tokens_per_s=best, completion_tokens=64, prompt_tokens=50, runs=runs
    )


def test_the_decode_verdict_rests_on_the_paired_interval_when_every_run_was_kept() -> None:
    clear = check_decode_vs_raw([_decode(RAW, [10.0, 10.0, 10.0]), _decode(EXO_NO_TOOLS, [9.95, 9.9, 10.0])])
    assert clear.verdict == "met"
    assert "whole interval is at or above" in clear.why
    unsettled = check_decode_vs_raw([_decode(RAW, [10.0, 10.0, 10.0]), _decode(EXO_NO_TOOLS, [9.0, 10.3, 9.8])])
    assert unsettled.verdict == "not settled"
    assert "reaches both sides" in unsettled.why
    # A run the client could not time (None) drops out of the pairs instead of counting as zero.
    partial = check_decode_vs_raw([_decode(RAW, [10.0, 10.0, 10.0]), _decode(EXO_NO_TOOLS, [9.9, None, 9.9])])
    assert "2 pairs" in partial.why
