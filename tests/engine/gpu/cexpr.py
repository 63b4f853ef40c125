"""Evaluate the C expressions of fused kernels with numpy, to check generated code on the CPU.

Covers what the registry's expressions and `c_literal` produce: numbers (``f`` suffix for
float), ``a``/``b``, unary ``- !``, ``* / + -``, comparisons, ``&& ||``, ``?:``, parentheses,
math functions and the ``__int_as_float``-style bit-pattern literals. Types follow C: a ``float``
literal keeps float32 math, an unsuffixed one promotes to double.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

_TOKEN = re.compile(r"\s*(0x[0-9a-fA-F]+(?:LL)?|\d+\.\d*(?:e[+-]?\d+)?f?|\d+e[+-]?\d+f?|\d+f?"
                    r"|[A-Za-z_]\w*|&&|\|\||==|!=|<=|>=|[-+*/%<>!?:(),])")
_BINARY = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, ">": 4, "<=": 4, ">=": 4,
           "+": 5, "-": 5, "*": 6, "/": 6}
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _lgamma(x: float) -> float:
    return math.inf if x <= 0 and x == math.floor(x) else math.lgamma(x)


def _tgamma(x: float) -> float:
    try:
        return math.gamma(x)
    except OverflowError:
        return math.inf
    except ValueError:  # a pole: C gives +-inf at +-0 and nan at the negative integers
        return math.copysign(math.inf, x) if x == 0 else math.nan


def _erfinv(y: float) -> float:
    if abs(y) >= 1:
        return math.copysign(math.inf, y) if abs(y) == 1 else math.nan
    return statistics.NormalDist().inv_cdf((1 + y) / 2) * math.sqrt(0.5)


def _float_result(function: Callable[[float], float]) -> Callable[[Any], Any]:
    vectorized = np.vectorize(function, otypes=[np.float64])
    return lambda x: vectorized(x).astype(np.result_type(x, np.float32))


def _round(x: Any) -> Any:
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "log2": np.log2,
    "log10": np.log10, "sqrt": np.sqrt, "cbrt": np.cbrt, "tanh": np.tanh, "sinh": np.sinh,
    "cosh": np.cosh, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "fabs": np.abs, "ceil": np.ceil, "floor": np.floor,
    "trunc": np.trunc, "round": _round, "fmod": np.fmod, "pow": np.power, "hypot": np.hypot,
    "erf": lambda x: _ERF(x).astype(np.result_type(x, np.float32)),
    "tgamma": _float_result(_tgamma), "lgamma": _float_result(_lgamma),
    "erfinv": _float_result(_erfinv),
    "__int_as_float": lambda bits: np.array(bits, np.uint32).view(np.float32)[()],
    "__longlong_as_double": lambda bits: np.array(bits, np.uint64).view(np.float64)[()],
}


def tokenize(text: str) -> list[str]:
    """The expression's tokens; raises ValueError on anything it does not know."""
    tokens, position = [], 0
    while position < len(text.rstrip()):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"cannot read {text[position:]!r}")
        tokens.append(match.group(1))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str, names: Mapping[str, Any]) -> None:
        self.tokens = tokenize(text)
        self.index = 0
        self.names = names

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'a token'}, got {token!r}")
        self.index += 1
        return token

    def expression(self) -> Any:
        condition = self.binary(1)
        if self.peek() != "?":
            return condition
        self.take("?")
        yes = self.expression()
        self.take(":")
        no = self.expression()
        return np.where(np.asarray(condition) != 0, yes, no)

    def binary(self, level: int) -> Any:
        left = self.unary()
        while (op := self.peek()) in _BINARY and _BINARY[op] >= level:
            self.take()
            right = self.binary(_BINARY[op] + 1)
            left = _apply(op, left, right)
        return left

    def unary(self) -> Any:
        token = self.peek()
        if token == "-":
            self.take()
            return -self.unary()
        if token == "!":
            self.take()
            return np.logical_not(self.unary())
        return self.primary()

    def primary(self) -> Any:
        token = self.take()
        if token == "(":
            value = self.expression()
            self.take(")")
            return value
        if token[0].isdigit():
            return _number(token)
        if self.peek() == "(":
            self.take("(")
            args = [self.expression()]
            while self.peek() == ",":
                self.take(",")
                args.append(self.expression())
            self.take(")")
            return FUNCTIONS[token](*args)
        return self.names[token]


def _number(token: str) -> Any:
    if token.startswith("0x"):
        return int(token.rstrip("L"), 16)
    if token.endswith("f"):
        return np.float32(token[:-1])
    if "." in token or "e" in token:
        return np.float64(token)
    return int(token)


def _apply(op: str, left: Any, right: Any) -> Any:
    if op == "||":
        return np.logical_or(left != 0, right != 0)
    if op == "&&":
        return np.logical_and(left != 0, right != 0)
    operations = {"==": np.equal, "!=": np.not_equal, "<": np.less, ">": np.greater,
                  "<=": np.less_equal, ">=": np.greater_equal, "+": np.add,
                  "-": np.subtract, "*": np.multiply, "/": np.divide}
    return operations[op](left, right)


def evaluate(text: str, names: Mapping[str, Any]) -> Any:
    """The value of the C expression ``text`` with ``names`` bound (numpy semantics, C types)."""
    parser = _Parser(text, names)
    with np.errstate(all="ignore"):
        value = parser.expression()
    if parser.peek() is not None:
        raise ValueError(f"unexpected {parser.peek()!r} in {text!r}")
    return value
