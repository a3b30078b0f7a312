"""The runner's tokens-per-second-now: tokens counted within the last window, over the window."""

from exo.worker.runner.token_rate import TokenRate


def test_the_rate_covers_the_last_window_only() -> None:
    now = [100.0]
    rate = TokenRate(window_seconds=5.0, clock=lambda: now[0])
    assert rate.per_second() == 0.0
    rate.add(10)
    now[0] = 102.0
    rate.add(15)
    rate.add(0)
    rate.add(-3)  # a count that went back (a retried step) adds nothing
    assert rate.per_second() == 5.0
    now[0] = 105.5  # the first 10 are older than the window
    assert rate.per_second() == 3.0
    now[0] = 110.0
    assert rate.per_second() == 0.0
