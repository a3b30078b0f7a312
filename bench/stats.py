"""A mean with its 95% confidence interval (Student's t), for the few paired repeats a benchmark can afford."""

from collections.abc import Sequence
from dataclasses import dataclass
from math import sqrt
from statistics import mean, stdev

# Two-sided 95% quantiles of Student's t by degrees of freedom; past the table the normal quantile is close enough.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
_NORMAL_975 = 1.960


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    samples: int

    def describe(self, unit: str = "×") -> str:
        """`0.991× (95% interval 0.962–1.020, 5 pairs)`."""
        return f"{self.mean:.3f}{unit} (95% interval {self.low:.3f}–{self.high:.3f}, {self.samples} pairs)"


def mean_interval(values: Sequence[float]) -> Interval | None:
    """The mean of `values` and its 95% t-interval; None for fewer than two values."""
    if len(values) < 2:
        return None
    quantile = _T_975[len(values) - 2] if len(values) - 2 < len(_T_975) else _NORMAL_975
    half_width = quantile * stdev(values) / sqrt(len(values))
    centre = mean(values)
    return Interval(mean=centre, low=centre - half_width, high=centre + half_width, samples=len(values))
