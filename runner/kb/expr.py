"""A small, safe expression language for recipe predicates (`when:` in a card).

Cards are data written by people; a predicate such as ``N >= 32768 and K <= 2048`` must be
evaluated without ``eval``. We parse with :mod:`ast` and accept only comparisons, boolean and
arithmetic operators, numeric literals, names bound in the environment (M, N, K, batch, tokens,
experts, topk, cu_count, sm_count, xcds, ...) and a few pure functions.
"""
from __future__ import annotations

import ast
import math
import operator
from functools import lru_cache
from typing import Any, Mapping

_FUNCS = {
    "min": min,
    "max": max,
    "abs": abs,
    "ceil_div": lambda a, b: -(-a // b),
    "log2": math.log2,
    "is_pow2": lambda x: x > 0 and (int(x) & (int(x) - 1)) == 0,
}
_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMP = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class ExprError(ValueError):
    pass


@lru_cache(maxsize=512)
def parse(text: str) -> ast.Expression:
    """Parse and check an expression once; raises ExprError naming the offending construct."""
    if len(text) > 500:
        raise ExprError("expression longer than 500 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"syntax error in {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        ok = isinstance(
            node,
            (
                ast.Expression,
                ast.BoolOp,
                ast.And,
                ast.Or,
                ast.UnaryOp,
                ast.Not,
                ast.USub,
                ast.BinOp,
                ast.Compare,
                ast.Name,
                ast.Load,
                ast.Constant,
                ast.Call,
                ast.Tuple,
                ast.List,
                *(_BIN.keys()),
                *(_CMP.keys()),
            ),
        )
        if not ok:
            raise ExprError(f"{type(node).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, bool, str)):
            raise ExprError(f"constant {node.value!r} is not allowed")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise ExprError(f"only {sorted(_FUNCS)} may be called in {text!r}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            # Guard against 10**10**10 style blow-ups in a card.
            if not (isinstance(node.right, ast.Constant) and isinstance(node.right.value, int) and node.right.value <= 64):
                raise ExprError("exponent must be an integer literal <= 64")
    return tree


def names(text: str) -> set[str]:
    """The free variable names an expression reads (used by lint to check the vocabulary)."""
    tree = parse(text)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called - {"True", "False"}


class MissingName(ExprError):
    def __init__(self, name: str):
        super().__init__(f"needs {name!r}, which is not known for this shape/device")
        self.name = name


def evaluate(text: str, env: Mapping[str, Any]) -> Any:
    """Evaluate a checked expression. A name absent from ``env`` raises MissingName."""
    return _eval(parse(text).body, env)


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in ("True", "False"):
            return node.id == "True"
        if node.id not in env or env[node.id] is None:
            raise MissingName(node.id)
        return env[node.id]
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, env) for v in node.values)
        return any(_eval(v, env) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](*[_eval(a, env) for a in node.args])
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, env) for e in node.elts)
    raise ExprError(f"cannot evaluate {type(node).__name__}")
