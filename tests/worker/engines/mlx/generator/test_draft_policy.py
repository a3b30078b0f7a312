"""Drafting decisions without a model: what the lookup proposes and how long a draft the measured costs justify."""

from exo.shared.types.worker.decode_settings import LookupSettings
from exo.worker.engines.mlx.generator.draft_policy import EXPLORE_AFTER_STEPS, DraftPolicy, PassTimes, StepCosts
from exo.worker.engines.mlx.generator.prompt_lookup import PromptLookup

SETTINGS = LookupSettings(max_draft_tokens=4, longest_ngram=3, shortest_ngram=2)


def test_lookup_continues_the_latest_earlier_occurrence_of_the_longest_matching_suffix() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3], SETTINGS)
    # Suffix (1, 2, 3) occurred at the start, followed by 4 5 9; (2, 3) alone last occurred before 7 8.
    assert lookup.propose(10) == [4, 5, 9, 2]
    assert lookup.propose(2) == [4, 5]
    lookup.extend([6])
    assert lookup.propose(10) == []  # (3, 6) and (6,) never occurred before; single tokens are not enough


def test_lookup_never_proposes_the_suffix_itself_and_sees_every_new_token() -> None:
    lookup = PromptLookup([5, 6], SETTINGS)
    assert lookup.propose(4) == []
    lookup.extend([5, 6])
    assert lookup.propose(4) == [5, 6]  # the first (5, 6) was followed by the second


def costs(per_token: float, base: float = 1.0, longest: int = 9) -> StepCosts:
    measured = StepCosts()
    for fed in range(1, longest + 1):
        measured.record(fed, base + per_token * (fed - 1))
    return measured


def test_without_measurements_every_draft_is_verified_in_full() -> None:
    assert DraftPolicy(StepCosts(), maximum=8).draft_length(5) == 5
    assert DraftPolicy(StepCosts(), maximum=3).draft_length(5) == 3


def test_where_extra_tokens_cost_a_whole_pass_each_a_draft_never_pays() -> None:
    policy = DraftPolicy(costs(per_token=1.0), maximum=8)
    assert policy.draft_length(8) == 0


def test_cheap_passes_and_holding_drafts_give_long_drafts_and_misses_shorten_them() -> None:
    policy = DraftPolicy(costs(per_token=0.05), maximum=8)
    for _ in range(6):
        policy.record(drafted=8, accepted=8)
    assert policy.acceptance > 0.9
    assert policy.draft_length(8) == 8
    for _ in range(6):
        policy.record(drafted=8, accepted=0)
    assert policy.acceptance < 0.2
    assert policy.draft_length(8) < 2


def test_declined_drafts_are_tried_again_now_and_then_to_remeasure() -> None:
    policy = DraftPolicy(costs(per_token=1.0), maximum=8)
    for _ in range(EXPLORE_AFTER_STEPS):
        assert policy.draft_length(6) == 0
        policy.declined()
    assert policy.draft_length(6) == 6
    policy.record(drafted=6, accepted=1)
    assert policy.draft_length(6) == 0


def test_an_unmeasured_pass_length_costs_what_the_nearest_shorter_measured_one_does() -> None:
    measured = StepCosts()
    measured.record(1, 1.0)
    assert measured.relative_cost(5) == 1.0
    measured.record(9, 3.0)
    assert measured.relative_cost(5) == 1.0  # a lower bound: never less than a shorter pass, so it gets tried
    assert measured.relative_cost(12) == 3.0
    measured.record(4, 2.0)
    assert measured.relative_cost(3) == 1.0
    assert measured.relative_cost(5) == 2.0


def test_a_cheap_pass_length_between_expensive_ones_is_found_and_kept() -> None:
    # MKL on x86: a 3-token pass costs 1.27x a plain one, a 4-token pass 2.10x. Drafts hold 2 times in 3.
    measured = StepCosts()
    for fed, cost in ((1, 1.0), (2, 1.14), (4, 2.10), (9, 2.86)):
        measured.record(fed, cost)
    policy = DraftPolicy(measured, maximum=8)
    for _ in range(8):
        policy.record(drafted=8, accepted=2)
    assert 0.6 < policy.acceptance < 0.7
    chosen = policy.draft_length(8)
    assert chosen == 2  # 3 tokens fed, unmeasured: tried at the 2-token pass's cost
    measured.record(chosen + 1, 1.27)
    assert policy.draft_length(8) == 2  # measured cheap: kept, since 2.85 tokens for 1.27 passes beats the rest
    measured.record(3, 2.5)
    measured.record(3, 2.5)
    measured.record(3, 2.5)
    assert policy.draft_length(8) != 2  # where it turns out expensive, another length takes over


def test_declined_drafts_that_would_have_held_bring_verification_back() -> None:
    # A miss early on makes drafts look unprofitable; what the model then writes shows the declined drafts hold.
    policy = DraftPolicy(costs(per_token=0.45), maximum=8)
    policy.record(drafted=1, accepted=0)
    assert policy.draft_length(8) == 0
    for _ in range(4):
        policy.observe(drafted=8, accepted=8)
    assert policy.draft_length(8) > 0
    for _ in range(6):
        policy.observe(drafted=8, accepted=0)
    assert policy.draft_length(8) == 0


def test_pass_costs_are_shared_relative_to_each_requests_own_one_token_passes() -> None:
    # Over a short context a one-token pass takes 80 ms, over a long one 100 ms; both take 1.25x that for 3 tokens.
    # Absolute times from the two would say a 3-token pass costs 125 / 80 = 1.56x.
    shared = StepCosts()
    short, long = PassTimes(shared), PassTimes(shared)
    long.record(3, 0.5)  # before its first one-token pass: nothing to compare with, not shared
    assert shared.measured() == {}
    short.record(1, 0.080)
    long.record(1, 0.100)
    long.record(3, 0.125)
    short.record(3, 0.100)
    assert shared.measured()[1] == 1.0
    assert abs(shared.measured()[3] - 1.25) < 1e-9


def test_a_draft_after_one_that_held_in_full_is_judged_by_how_such_drafts_fared() -> None:
    # Drafts away from any copy miss; once one holds in full, a copy is under way and the next ones hold too. One
    # rate for both would average the misses into the copy and keep its drafts short.
    policy = DraftPolicy(costs(per_token=0.2), maximum=8)
    for _ in range(4):
        policy.record(drafted=8, accepted=0)
    policy.record(drafted=8, accepted=8)
    for _ in range(5):
        policy.record(drafted=8, accepted=8)
    assert policy.acceptance > 0.9  # the last draft held in full: mid-copy
    assert policy.draft_length(8) >= 6
    policy.record(drafted=8, accepted=3)
    assert policy.acceptance < 0.5  # after a miss: how drafts away from a copy fared
    assert policy.draft_length(8) <= 1
