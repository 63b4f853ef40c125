"""Parsers that turn MXNet's string attributes (or Python values) into typed values.

MXNet stores every operator attribute as a string written the way Python prints the value:
``"(3, 3)"``, ``"True"``, ``"None"``, ``"1e-05"``, ``"float16"``. Each parser here accepts either
that string or the Python value itself, so the same schema serves JSON import, `nd` and `sym`.
Parsers raise ``ValueError`` with a short description; the registry adds the op and node.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Parser = Callable[[Any], Any]


# CPython 3.11's AST builder counts its recursion depth in state its threads share: two threads
# parsing at once (two models loading), one of them switched out mid-parse by a finalizer, fail
# with "AST constructor recursion depth mismatch" (reproduced on 3.11.7; python/cpython#106905).
# A parse takes microseconds, so one lock costs nothing.
_PARSE_LOCK = threading.Lock()


def parse_literal(text: str) -> Any:
    """A Python literal written as MXNet writes attributes; ``ValueError`` when it is not one."""
    try:
        with _PARSE_LOCK:
            return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"cannot read {text!r} as a value") from None


def parse_bool(value: Any) -> bool:
    """``"True"``/``"False"``/``"1"``/``"0"`` (any case) or a Python bool/int."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
        raise ValueError(f"expected True or False, got {value!r}")
    if isinstance(value, (bool, int, np.bool_, np.integer)):
        return bool(value)
    raise ValueError(f"expected a boolean, got {value!r}")


def parse_int(value: Any) -> int:
    """An integer written as ``"3"`` (``"3.0"`` is refused, as in MXNet)."""
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError(f"expected an integer, got {value!r}") from None
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise ValueError(f"expected an integer, got {value!r}")


def parse_float(value: Any) -> float:
    """A float, from any of Python's spellings (``"2"``, ``"2.0"``, ``"1e-05"``, ``"inf"``)."""
    try:
        return float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {value!r}") from None


def parse_str(value: Any) -> str:
    """Any string, kept as written."""
    if isinstance(value, str):
        return value
    raise ValueError(f"expected a string, got {value!r}")


def _sequence(value: Any) -> Sequence[Any]:
    if isinstance(value, str):
        value = parse_literal(value) if value.strip() not in ("", "()", "[]") else ()
    if isinstance(value, (int, np.integer, float, np.floating)) or value is None:
        return (value,)
    if isinstance(value, (tuple, list)):
        return value
    raise ValueError(f"expected a tuple, got {value!r}")


def parse_int_tuple(value: Any) -> tuple[int, ...]:
    """``"(3, 3)"``, ``"[3, 3]"``, ``"3"``, ``"()"`` or a Python int/sequence."""
    return tuple(parse_int(item) for item in _sequence(value))


def parse_float_tuple(value: Any) -> tuple[float, ...]:
    """``"(0.5, 2)"`` or a Python number/sequence."""
    return tuple(parse_float(item) for item in _sequence(value))


def parse_optional_int_tuple(value: Any) -> tuple[int | None, ...]:
    """A tuple whose items may be ``None``, as in ``slice``'s ``"(None, 1, None)"``."""
    return tuple(None if item is None else parse_int(item) for item in _sequence(value))


def optional(parser: Parser) -> Parser:
    """Wrap a parser so that ``"None"`` (or ``None``) gives ``None``."""

    def parse(value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip() == "None"):
            return None
        return parser(value)

    parse.__name__ = f"optional_{getattr(parser, '__name__', 'value')}"
    return parse


def choice(*allowed: str) -> Parser:
    """A string that must be one of ``allowed``."""

    def parse(value: Any) -> str:
        text = parse_str(value)
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}; got {text!r}")
        return text

    parse.__name__ = "choice"
    return parse


def parse_dtype(value: Any) -> np.dtype:
    """A dtype name (``"float16"``), a numpy dtype, or a Python type."""
    if isinstance(value, str) and value.strip() == "bfloat16":
        raise ValueError("bfloat16 is not supported for computation")
    try:
        return np.dtype(value.strip() if isinstance(value, str) else value)
    except TypeError:
        raise ValueError(f"expected a dtype name, got {value!r}") from None


def format_attr(value: Any) -> str:
    """Write a Python value the way MXNet stores attributes (what ``str`` gives, dtypes by name)."""
    if isinstance(value, str):
        return value
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        value = value.item()
    return str(value)
