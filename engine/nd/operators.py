"""Python's arithmetic and comparison operators, for `NDArray` and `Symbol` from one table.

The two front ends differ only in which registry op each operator runs (``a + b`` on NDArrays
broadcasts, as MXNet's ``broadcast_add``; on Symbols it is ``_Plus``) and in what in-place
forms do (NDArrays write into themselves; Symbols are immutable and refuse). Each class gives
its ops per operation and a ``binary(self, other, array_op, scalar_op, reflected)``; the
methods are made here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# method -> (operation, whether the other operand comes first)
BINARY: dict[str, tuple[str, bool]] = {
    "__add__": ("add", False), "__radd__": ("add", False),
    "__sub__": ("sub", False), "__rsub__": ("sub", True),
    "__mul__": ("mul", False), "__rmul__": ("mul", False),
    "__truediv__": ("div", False), "__rtruediv__": ("div", True),
    "__mod__": ("mod", False), "__rmod__": ("mod", True),
    "__pow__": ("pow", False), "__rpow__": ("pow", True),
    "__eq__": ("equal", False), "__ne__": ("not_equal", False),
    "__gt__": ("greater", False), "__ge__": ("greater_equal", False),
    "__lt__": ("lesser", False), "__le__": ("lesser_equal", False),
}
# in-place method -> (operation, its operator's spelling)
IN_PLACE: dict[str, tuple[str, str]] = {
    "__iadd__": ("add", "+"), "__isub__": ("sub", "-"), "__imul__": ("mul", "*"),
    "__itruediv__": ("div", "/"), "__imod__": ("mod", "%"), "__ipow__": ("pow", "**"),
}

# operation -> (op on two arrays, op with a scalar second, op with a scalar first)
Ops = Mapping[str, tuple[str, str, str]]
Binary = Callable[..., Any]


def add_operators(cls: type, ops: Ops, binary: Binary,
                  in_place: Callable[[str, str, str], Callable[[Any, Any], Any]]) -> None:
    """Give ``cls`` every method of `BINARY` through ``binary`` and of `IN_PLACE` through
    ``in_place(method, operation, spelling)``, which returns the method."""
    for method, (operation, reflected) in BINARY.items():
        array_op, scalar_op, reflected_scalar_op = ops[operation]
        setattr(cls, method, _binary_method(
            method, binary, array_op, reflected_scalar_op if reflected else scalar_op, reflected))
    for method, (operation, spelling) in IN_PLACE.items():
        setattr(cls, method, in_place(method, operation, spelling))


def _binary_method(name: str, binary: Binary, array_op: str, scalar_op: str,
                   reflected: bool) -> Callable[[Any, Any], Any]:
    def method(self: Any, other: Any) -> Any:
        return binary(self, other, array_op, scalar_op, reflected)

    method.__name__ = method.__qualname__ = name
    return method
