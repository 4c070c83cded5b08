"""Arithmetic expressions evaluated by walking their `ast`, never with ``eval``.

Only numbers, ``+ - * / // % **``, unary signs, parentheses and a few named
functions are allowed. Sizes are bounded (expression length, exponent,
magnitude of every intermediate result) so a model cannot make the
calculator compute ``9**9**9`` for an hour.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e30

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: dict[str, Callable[..., float]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
}


class CalcError(ValueError):
    """The expression is not allowed or cannot be computed; the message says why."""


def evaluate(expression: str) -> float:
    """The value of ``expression``; `CalcError` for anything but bounded arithmetic."""
    text = expression.strip().replace("\u00d7", "*").replace("\u00f7", "/")  # x and division signs
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalcError(f"not an arithmetic expression: {text!r}") from None
    return _eval(tree.body)


def format_number(value: float) -> str:
    """Integers without a decimal point; other values to 12 significant digits."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return f"{value:.12g}"


def _eval(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise CalcError("True and False are not numbers here")
        return _bounded(node.value)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.BitXor):
            raise CalcError("'^' is not a power here; write ** (2**3 is 8)")
        fn = _BINARY.get(type(node.op))
        if fn is None:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed")
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalcError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            return _bounded(fn(left, right))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except (OverflowError, TypeError):
            raise CalcError("result out of range") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _FUNCTIONS.get(node.func.id)
        if fn is None:
            raise CalcError(f"unknown function {node.func.id!r}; known: {', '.join(_FUNCTIONS)}")
        try:
            return _bounded(fn(*[_eval(arg) for arg in node.args]))
        except (TypeError, ValueError) as exc:
            raise CalcError(f"{node.func.id}: {exc}") from None
    raise CalcError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _bounded(value: float) -> float:
    if isinstance(value, complex) or not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalcError("result out of range")
    return value
