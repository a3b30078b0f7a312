"""A target's verdict, and the number formats every verdict uses."""

from bench.results import BenchModel


class TargetCheck(BenchModel):
    target: str
    measured: str
    met: bool
    why: str


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
