"""The paired-ratio interval the decode verdict rests on."""

import pytest

from bench.stats import mean_interval


def test_the_interval_is_the_student_t_interval_of_the_mean() -> None:
    interval = mean_interval([0.96, 0.98, 1.00])
    assert interval is not None
    # mean 0.98, sample stdev 0.02, t(0.975, 2 df) = 4.303: half-width 4.303 * 0.02 / sqrt(3) = 0.0497.
    assert interval.mean == pytest.approx(0.98)
    assert interval.low == pytest.approx(0.98 - 0.04969, abs=1e-4)
    assert interval.high == pytest.approx(0.98 + 0.04969, abs=1e-4)
    assert interval.describe() == "0.980× (95% interval 0.930–1.030, 3 pairs)"


def test_identical_ratios_give_a_point_and_one_ratio_gives_no_interval() -> None:
    interval = mean_interval([0.99] * 5)
    assert interval is not None
    assert interval.low == pytest.approx(interval.high)
    assert mean_interval([0.99]) is None


def test_many_pairs_use_the_normal_quantile() -> None:
    values = [0.9, 1.1] * 20
    interval = mean_interval(values)
    assert interval is not None
    # stdev of forty alternating ±0.1 values is 0.1013; 1.96 * 0.1013 / sqrt(40) = 0.0314.
    assert interval.high - interval.mean == pytest.approx(0.0314, abs=1e-3)
