"""The example's calculator evaluates plain arithmetic and refuses everything else, without ever calling eval."""

import time

import pytest

from examples.tool_calling_example import MAX_EXPRESSION_LENGTH, CalculationError, calculate


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("2 ** 10", 1024),
        ("-3 + 5", 2),
        ("-(2 + 3) * -2", 10),
        ("7 % 4", 3),
        ("7 / 2", 3.5),
        ("1.5 * 4", 6.0),
        ("2 ** -1", 0.5),
        ("  (2 + 3) * 7 - 2 ** 5 ", 3),
    ],
)
def test_arithmetic_follows_python_precedence(expression: str, expected: float) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "(1).real",
        "x + 1",
        "abs(-1)",
        "True + 1",
        "'a' * 3",
        "[1, 2]",
        "1 if 1 else 2",
        "lambda: 1",
        "1 < 2",
        "1 // 2",
        "1 << 2",
        "+1",
        "1j * 1j",
    ],
)
def test_anything_but_numbers_and_the_allowed_operators_is_rejected(expression: str) -> None:
    with pytest.raises(CalculationError):
        calculate(expression)


def test_a_statement_is_not_an_expression() -> None:
    with pytest.raises(CalculationError, match="not an arithmetic expression"):
        calculate("import os")


@pytest.mark.parametrize("expression", ["9 ** 9 ** 9", "2 ** 100000", "(10 ** 1000) ** 1000", "(-7) ** 99999"])
def test_a_huge_power_is_refused_before_it_is_computed(expression: str) -> None:
    started = time.monotonic()
    with pytest.raises(CalculationError, match="too large"):
        calculate(expression)
    assert time.monotonic() - started < 1.0


def test_repeated_multiplication_cannot_grow_past_the_bound() -> None:
    with pytest.raises(CalculationError, match="too large"):
        calculate("10 ** 1000 * 10 ** 1000")


def test_a_long_expression_is_refused() -> None:
    with pytest.raises(CalculationError, match="longer than"):
        calculate("1 + " * MAX_EXPRESSION_LENGTH + "1")


@pytest.mark.parametrize("expression", ["1 / 0", "1 % 0", "10.0 ** 400", "(-8) ** 0.5"])
def test_arithmetic_errors_become_calculation_errors(expression: str) -> None:
    with pytest.raises(CalculationError):
        calculate(expression)
