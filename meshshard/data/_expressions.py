"""Arithmetic on a sample's parameters, for non-dimensional targets: ``0.5 * speed**2``.

An expression is read from the command line or from ``dataset.json`` (a file a user may have
received), so it is parsed, never run: numbers, parameter names, ``+ - * / **``, unary minus and
parentheses, and nothing else (no calls, no attributes, no names but the parameters').
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["check_expression", "evaluate_columns", "evaluate_expression", "expression_names", "parse_target_scales"]

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


#: The longest expression read (a scale is a short formula): bounds the parser's and the walks' recursion,
#: so that a long chain (60,000 terms, 100,000 unary minuses) is one line, never a ``RecursionError``.
MAX_EXPRESSION_CHARS = 500


def _tree(text: str) -> ast.expr:
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"Expected an arithmetic expression of the parameters of at most {MAX_EXPRESSION_CHARS} "
                         f"characters (got {len(text):,}: {text[:40]!r}...)")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError):  # the parser's own limits: nesting, parser stack
        raise ValueError(f"Expected an arithmetic expression of the parameters (got {text!r})") from None


def _names(node: ast.AST, text: str) -> set[str]:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return set()
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _names(node.left, text) | _names(node.right, text)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _names(node.operand, text)
    raise ValueError(f"Expected numbers, parameter names, + - * / ** and parentheses only in {text!r} "
                     f"(got {ast.unparse(node)!r})")


def expression_names(text: str) -> set[str]:
    """The parameter names ``text`` uses; a one-line ``ValueError`` when it is not arithmetic."""
    return _names(_tree(text), text)


def check_expression(text: str, parameters: Sequence[str]) -> None:
    """Raise a one-line ``ValueError`` unless ``text`` is arithmetic of ``parameters`` only."""
    unknown = sorted(_names(_tree(text), text) - set(parameters))
    if unknown:
        raise ValueError(f"Expected {text!r} to use the parameters {', '.join(parameters) or '(none)'} only "
                         f"(got {', '.join(unknown)})")


def _value(node: ast.AST, values: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        value = values[node.id]
        return float(value) if isinstance(value, int | float) else value
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_value(node.left, values), _value(node.right, values))
    return _UNARY[type(node.op)](_value(node.operand, values))  # type: ignore[attr-defined]


def evaluate_expression(text: str, values: Mapping[str, float]) -> float:
    """The value of ``text`` for the parameters ``values``; a one-line ``ValueError`` when it is not
    a finite number (a division by zero, an overflow)."""
    check_expression(text, list(values))
    try:
        result = _value(_tree(text), values)
    except (ZeroDivisionError, OverflowError, TypeError):
        result = math.nan
    if isinstance(result, complex) or not math.isfinite(result):
        raise ValueError(f"Expected {text!r} to be a finite number (got {result} for {_parameters_of(values)})")
    return float(result)


def _parameters_of(values: Mapping[str, float]) -> str:
    """``aoa=2, speed=10`` for a message; ``no parameters`` for none (never an empty ``for )``)."""
    return ", ".join(f"{k}={v:g}" for k, v in values.items()) or "no parameters"


def evaluate_columns(text: str, columns: Mapping[str, Any]) -> Any:
    """``text`` evaluated element-wise on arrays or tensors of the parameters (one value per row):
    the same arithmetic as :func:`evaluate_expression`, for a model's rows; not checked finite."""
    check_expression(text, list(columns))
    return _value(_tree(text), columns)


def parse_target_scales(text: str) -> dict[str, str]:
    """``"p=0.5*speed**2, U=speed"`` -> ``{"p": "0.5*speed**2", "U": "speed"}`` (one-line
    ``ValueError`` when an item is not ``FIELD=EXPRESSION``)."""
    scales: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        field, sep, expression = item.partition("=")
        if not sep or not field.strip() or not expression.strip():
            raise ValueError(f"Expected --target-scale as FIELD=EXPRESSION, comma-separated (got {item!r})")
        _names(_tree(expression), expression)
        if field.strip() in scales:
            raise ValueError(f"Expected each field once in --target-scale (got {field.strip()!r} twice: "
                             f"{scales[field.strip()]!r} and {expression.strip()!r})")
        scales[field.strip()] = expression.strip()
    return scales
