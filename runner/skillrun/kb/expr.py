"""A small, safe expression language for recipe predicates (`when:` in a card).

Cards are data written by people; a predicate such as ``N >= 32768 and K <= 2048`` must be
evaluated without ``eval``. We parse with :mod:`ast` and accept only comparisons, boolean and
arithmetic operators, numeric literals, names bound in the environment (M, N, K, batch, tokens,
experts, topk, cu_count, sm_count, xcds, ...) and a few pure functions.

A card is untrusted data, so evaluation is bounded whatever the text says (the same code runs for
``lint`` and for matching): every intermediate number must stay within ``MAX_MAGNITUDE`` (a power
is refused *before* it is computed if its result would not), sequences are never repeated or
concatenated, and each evaluation has a step budget. Going past a bound raises
:class:`BoundExceeded`, an :class:`ExprError`.
"""
from __future__ import annotations

import ast
import math
import operator
import time
from functools import lru_cache
from typing import Any, Mapping

# Far beyond any problem dimension or product of them (M*N*K of a 10^12-row shape is 10^36),
# small enough that arithmetic on it is instant.
MAX_MAGNITUDE = 2**128
MAX_STEPS = 2000  # nodes visited per evaluation (a 500-character predicate has far fewer)
MAX_SECONDS = 0.25  # wall-clock guard on top of the step budget
MAX_STR = 500  # longest string value an expression may produce

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


class BoundExceeded(ExprError):
    """The expression went past a safety bound (magnitude, sequence operation, steps, time)."""


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
    """Evaluate a checked expression. A name absent from ``env`` raises MissingName.

    Every failure is an :class:`ExprError` (math domain errors, type errors and overflow included),
    so a caller has one exception to handle and a hostile predicate can never escape as a crash.
    """
    ev = _Evaluator(env)
    try:
        return ev.eval(parse(text).body)
    except ExprError:
        raise
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise ExprError(f"{type(exc).__name__} in {text!r}: {exc}") from None
    except RecursionError:
        raise BoundExceeded(f"{text!r} nests too deeply") from None


def _check_value(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        if v > MAX_MAGNITUDE or v < -MAX_MAGNITUDE:
            raise BoundExceeded(f"intermediate value exceeds 2**128 (about {len(str(abs(v)))} digits)")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise BoundExceeded(f"intermediate value {v} is not finite")
        if abs(v) > MAX_MAGNITUDE:
            raise BoundExceeded(f"intermediate value {v:.3g} exceeds 2**128")
        return v
    if isinstance(v, str):
        if len(v) > MAX_STR:
            raise BoundExceeded(f"string value longer than {MAX_STR} characters")
        return v
    if isinstance(v, tuple):
        for e in v:
            _check_value(e)
        return v
    raise ExprError(f"value of type {type(v).__name__} is not allowed in a predicate")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float))


def _pow(a: Any, b: Any) -> Any:
    if not (_is_num(a) and _is_num(b)):
        raise ExprError("** takes numbers only")
    # Decide from the operands' sizes whether the result can stay in bounds, before computing it:
    # (10**64)**64 would otherwise take seconds and megabytes to build only to be refused.
    if abs(a) > 1 and b > 0 and b * math.log2(abs(a)) > 129:
        raise BoundExceeded(f"{a!r} ** {b!r} exceeds 2**128")
    if a == 0 and b < 0:
        raise ExprError("0 cannot be raised to a negative power")
    return a**b


def _no_sequences(fn):
    def op(a: Any, b: Any) -> Any:
        if isinstance(a, (str, tuple)) or isinstance(b, (str, tuple)):
            # "x" * 10**9 or (1,) * 10**9: sequence repetition and concatenation are refused.
            raise BoundExceeded("arithmetic on strings or lists (repetition, concatenation) is not allowed")
        return fn(a, b)

    return op


_ARITH = {op: _no_sequences(fn) for op, fn in _BIN.items()}
_ARITH[ast.Pow] = _no_sequences(_pow)


class _Evaluator:
    def __init__(self, env: Mapping[str, Any]):
        self.env = env
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise BoundExceeded(f"evaluation took more than {MAX_STEPS} steps")
        if self.steps % 64 == 0 and time.monotonic() > self.deadline:
            raise BoundExceeded(f"evaluation took longer than {MAX_SECONDS}s")

    def eval(self, node: ast.AST) -> Any:
        self._tick()
        return _check_value(self._eval(node))

    def _eval(self, node: ast.AST) -> Any:
        env = self.env
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
                return all(self.eval(v) for v in node.values)
            return any(self.eval(v) for v in node.values)
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return not v
            if not _is_num(v):
                raise ExprError("unary minus takes a number")
            return -v
        if isinstance(node, ast.BinOp):
            return _ARITH[type(node.op)](self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = self.eval(comp)
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            args = [self.eval(a) for a in node.args]
            if not all(_is_num(a) for a in args):
                raise ExprError(f"{node.func.id}() takes numbers only")
            return _FUNCS[node.func.id](*args)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.eval(e) for e in node.elts)
        raise ExprError(f"cannot evaluate {type(node).__name__}")
