"""Expressions of a sample's parameters (``--target-scale``) are parsed, never run."""

from __future__ import annotations

import pytest

from meshshard.data import evaluate_expression, parse_target_scales


@pytest.mark.parametrize(("text", "value"), [("0.5*speed**2", 50.0), ("-speed / (2 + aoa)", -2.5),
                                              ("speed", 10.0), ("3", 3.0)])
def test_arithmetic_of_the_parameters(text: str, value: float) -> None:
    assert evaluate_expression(text, {"speed": 10.0, "aoa": 2.0}) == value


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "speed.real", "abs(speed)", "[speed]",
                                  "speed if aoa else 1", "lambda: 1", "'text'", "speed @ aoa"])
def test_anything_but_arithmetic_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^Expected (numbers, parameter names|an arithmetic expression)"):
        evaluate_expression(text, {"speed": 10.0, "aoa": 2.0})


@pytest.mark.parametrize("text", ["1/aoa", "speed**1000", "0*speed - 1e308*1e308"])
def test_a_value_that_is_not_a_finite_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"to be a finite number"):
        evaluate_expression(text, {"speed": 10.0, "aoa": 0.0})


def test_target_scales() -> None:
    assert parse_target_scales("p=0.5*speed**2, U = speed") == {"p": "0.5*speed**2", "U": "speed"}
    with pytest.raises(ValueError, match=r"FIELD=EXPRESSION, comma-separated \(got 'p'\)"):
        parse_target_scales("p")


@pytest.mark.parametrize("text", ["+".join(["speed"] * 60000), "-" * 100000 + "speed", "(" * 300 + "speed" + ")" * 300])
def test_an_expression_too_long_or_deep_is_one_line_not_a_recursion_or_memory_error(text: str) -> None:
    """Issue 36, defect 10: a 60,000-term --target-scale was a RecursionError (and the same parser
    reads a received dataset.json's target_scales), 100k unary minuses a bare MemoryError."""
    with pytest.raises(ValueError, match=r"^Expected an arithmetic expression of the parameters"):
        evaluate_expression(text, {"speed": 2.0})
    with pytest.raises(ValueError, match=r"^Expected an arithmetic expression of the parameters"):
        parse_target_scales(f"p={text}")


def test_a_target_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^Expected each field once in --target-scale \(got 'p' twice: 'speed' and "
                                         r"'2\*speed'\)$"):
        parse_target_scales("p=speed, p=2*speed")


def test_a_value_with_no_parameters_says_so() -> None:
    """Issue 36 (minor): --force-reference messages ended in "for )" where a dataset has no parameters."""
    with pytest.raises(ValueError, match=r"^Expected '1/0' to be a finite number \(got nan for no parameters\)$"):
        evaluate_expression("1/0", {})
