"""A target's verdict, and the number formats every verdict uses."""

from bench.results import BenchModel
from bench.stats import Interval


class TargetCheck(BenchModel):
    target: str
    measured: str
    met: bool
    why: str
    settled: bool = True
    """False when the measurement cannot tell: the paired rounds' interval reaches both sides of the target, or no
    paired rounds were recorded. Such a target is neither met nor missed."""

    @property
    def verdict(self) -> str:
        """`met`, `**missed**` or `not settled`, as the report's Targets table writes it."""
        if not self.settled:
            return "not settled"
        return "met" if self.met else "**missed**"


def paired_verdict(interval: Interval, target: float) -> tuple[bool, bool, str]:
    """(met, settled, why) for a target `mean ≥ target` judged on the interval of paired rounds: met only when the
    whole interval is at or above it, missed only when the whole interval is below it, otherwise not settled."""
    if interval.low >= target:
        return True, True, "the whole interval is at or above the target"
    if interval.high < target:
        return False, True, "the whole interval is below the target"
    return (
        False,
        False,
        "the interval reaches both sides of the target: more rounds or a quieter machine would settle it",
    )


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either was not measurable (see `StreamMeasurement.decode_tokens_per_s`)."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def format_speed(tokens_per_s: float | None) -> str:
    """`6.71`, or `n/a` when the speed could not be measured."""
    return "n/a" if tokens_per_s is None else f"{tokens_per_s:.2f}"


def format_ratio(value: float | None) -> str:
    """`0.973×`, or `n/a` for a ratio that could not be measured."""
    return "n/a" if value is None else f"{value:.3f}×"
