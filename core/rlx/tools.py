"""Tools a model can call from an environment, each run in the sandbox (``rlx.sandbox``).

A tool takes the model's argument text and returns the text the model reads back: the
answer, or ``error: ...``. Nothing a tool call does can raise in the caller.
"""

from __future__ import annotations

import ast
import math
import operator

from rlx.sandbox import Limits, run_function

CALCULATOR_LIMITS = Limits(seconds=2.0, memory_mb=256, output_bytes=4096)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos,
              "tan": math.tan, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil}
_CONSTANTS = {"pi": math.pi, "e": math.e}


def calculator(expression: str, limits: Limits = CALCULATOR_LIMITS) -> str:
    """The value of an arithmetic ``expression`` as text, e.g. ``"2 + 3 * 4"`` -> ``"14"``.

    Arithmetic alone can still hang or exhaust memory (``9**9**9**9``): the sandbox's
    limits turn that into ``error: timed out ...`` instead of a stalled run.
    """
    result = run_function(arithmetic, expression, limits=limits)
    return str(result.value) if result.ok else f"error: {result.error}"


def arithmetic(expression: str) -> int | float:
    """Evaluate numbers, + - * / // % **, signs, parentheses, the functions in ``_FUNCTIONS``
    and the constants ``pi`` and ``e``. Anything else (names, attributes, other calls) is
    refused before evaluation, so an expression cannot run code."""
    if not isinstance(expression, str) or len(expression) > 1000:
        raise ValueError("the expression must be text of at most 1000 characters")
    return _value(ast.parse(expression.strip(), mode="eval").body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords):
        return _FUNCTIONS[node.func.id](*(_value(arg) for arg in node.args))
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")
